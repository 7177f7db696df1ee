"""Decentralised averaging: ``adpsgd`` and ``hierarchical`` (H-ADPSGD).

ADPSGD: every step a learner averages its model with one ring neighbour's and applies its
own gradient — no global barrier, only the pair waits for each other. Neighbours alternate
so that information travels both ways round the ring: on even rounds learners pair as
(0,1), (2,3), …; on odd rounds as (1,2), (3,4), …, (P-1,0); with an odd count one learner
sits a round out. The model is sent at the start of the step and travels while the
gradient is computed.

Hierarchical: learners on one node (``group_size`` consecutive ranks) form a synchronous
all-reduce group — a super-learner whose members hold identical models; the groups'
first learners run the ADPSGD exchange across nodes and broadcast the result in their
group, so only one model per node crosses the network.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from asrflow.parallel import ParallelError
from asrflow.parallel.base import Strategy, flat_grads, flat_params, load_grads, load_params
from asrflow.parallel.topology import partner


class ADPSGD(Strategy):
    """Pairwise model averaging with alternating ring neighbours, overlapped with computation."""

    name = "adpsgd"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.numel = sum(p.numel() for p in self.model.parameters())
        self.outbox = torch.empty(self.numel, device=self.wire)
        self.inbox = torch.empty(self.numel, device=self.wire)
        self.pending: list[Any] = []
        self.mate: int | None = None

    # The exchanging unit and its peers; the hierarchical strategy exchanges between groups.
    def exchange_index(self) -> tuple[int, int, bool]:
        """(index among exchanging units, unit count, whether this learner talks for its unit)."""
        return self.rank, self.world, True

    def peer_rank(self, mate: int) -> int:
        return mate

    def begin_step(self) -> None:
        super().begin_step()
        index, count, speaker = self.exchange_index()
        mate = partner(index, count, self.step)
        self.mate = self.peer_rank(mate) if mate is not None and speaker else None
        if self.mate is not None:
            with self.timed("merge"):
                self.outbox.copy_(flat_params(self.model))
            self.pending = [dist.isend(self.outbox, self.mate), dist.irecv(self.inbox, self.mate)]
            self.times.bytes += self.outbox.numel() * self.outbox.element_size()

    def _average_with_mate(self) -> bool:
        """Wait for the mate's model and average with it; False when this learner sat out."""
        if self.mate is None:
            return False
        with self.timed("wait"):
            for work in self.pending:
                self.wait(work, "the neighbour's model", self.mate)
        self.pending = []
        with self.timed("merge"):
            load_params(self.model, (self.outbox + self.inbox) / 2)
        return True

    def finish_step(self) -> None:
        self._average_with_mate()
        with self.timed("merge"):
            self.apply_gradient()
        self.step += 1

    def synchronise(self) -> None:
        if self.world == 1:
            return
        params = flat_params(self.model)
        self.collective("the end-of-epoch model all-reduce", dist.all_reduce, params)
        load_params(self.model, params / self.world)


class Hierarchical(ADPSGD):
    """Synchronous all-reduce inside groups of ``group_size``; ADPSGD between the groups."""

    name = "hierarchical"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        size = self.opts.group_size
        if size < 1 or self.world % size:
            raise ParallelError(f"hierarchical: {self.world} learners do not split into groups of "
                                f"nnet.parallel.group_size = {size}")
        self.size, self.group_index = size, self.rank // size
        self.leader = self.group_index * size
        self.group = None
        if self.world > 1:  # every rank creates every group, in the same order
            for first in range(0, self.world, size):
                group = dist.new_group(list(range(first, first + size)))
                if first == self.leader:
                    self.group = group

    def exchange_index(self) -> tuple[int, int, bool]:
        return self.group_index, self.world // self.size, self.rank == self.leader

    def peer_rank(self, mate: int) -> int:
        return mate * self.size

    def finish_step(self) -> None:
        if self.size > 1:
            with self.timed("merge"):
                grads = flat_grads(self.model)
            with self.timed("transmit"):
                self.collective("the in-group gradient all-reduce", dist.all_reduce, grads, group=self.group)
            self.times.bytes += 2 * (self.size - 1) / self.size * grads.numel() * grads.element_size()
            with self.timed("merge"):
                load_grads(self.model, grads / self.size)
        self._average_with_mate()
        index, count, _ = self.exchange_index()
        if self.size > 1 and partner(index, count, self.step) is not None:  # members take the averaged model
            params = flat_params(self.model)
            with self.timed("transmit"):
                self.collective("the in-group model broadcast", dist.broadcast, params, self.leader, group=self.group)
            if self.rank != self.leader:
                load_params(self.model, params)
        with self.timed("merge"):
            self.apply_gradient()
        self.step += 1
