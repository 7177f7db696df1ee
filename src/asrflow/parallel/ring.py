"""The ring structure parallel strategy (RSPS): one model circulates around a ring of learners.

Learner ``r`` repeats: (1) compute a gradient on its current local model; (2) receive the
model from learner ``r-1`` and merge its gradient into it (one optimiser step of its own
optimiser on the received parameters); (3) send the new model to learner ``r+1`` — without
waiting — and compute on the next minibatch while it travels. There is no central node and
one model transmission per minibatch per learner, overlapped with computation; a gradient
is ``P-1`` updates stale when it is merged. Learner 0 holds the model at the start of every
epoch; at the end the model comes back to it and is broadcast, so all learners start the
next epoch from the same model.

Throughput is limited by the model's trip around the ring: with ``n`` learners one merge
happens per ``T_transmit + T_merge``, so the speedup saturates at
``n_max = (T_calc + T_merge) / (T_transmit + T_merge)`` (:mod:`asrflow.parallel.timing`).

Compression (``1bit`` / ``8bit``) sends the model as a compressed change against a
reference both ends of a link share — the model as the link last delivered it — and the
receiver continues from the reconstruction.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist

from asrflow.parallel.base import Strategy, flat_params, load_params
from asrflow.parallel.compress import make_compressor


class Ring(Strategy):
    """RSPS on point-to-point ``isend`` / ``irecv``."""

    name = "ring"
    compressible = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.next, self.prev = (self.rank + 1) % self.world, (self.rank - 1) % self.world
        self.numel = sum(p.numel() for p in self.model.parameters())
        self.compressor = make_compressor(self.opts.compression)
        size = self.compressor.payload_size(self.numel)
        self.inbox = torch.empty(size, dtype=torch.uint8, device=self.wire)
        self.outbox = torch.empty(size, dtype=torch.uint8, device=self.wire)
        self.have_inbox = False  # a model already received (drained before a checkpoint)
        self.fresh = True  # epoch start: learner 0 holds the model
        self.receiving: Any = None
        self.sending: Any = None
        compressed = self.opts.compression != "none"
        # the model as the incoming link last delivered it
        self.ref_in = flat_params(self.model) if compressed else None
        self.ref_out = flat_params(self.model) if compressed else None
        self.transmit_estimate = self._measure_transmit() if self.world > 1 else 0.0

    def _needs_model(self) -> bool:
        return self.world > 1 and not (self.fresh and self.rank == 0)

    def begin_step(self) -> None:
        super().begin_step()
        if self._needs_model() and not self.have_inbox and self.receiving is None:
            self.receiving = dist.irecv(self.inbox, self.prev)

    def finish_step(self) -> None:
        if self._needs_model():
            self._receive()
            with self.timed("merge"):
                load_params(self.model, self._decode())
        with self.timed("merge"):
            self.apply_gradient()
        if self.world > 1:
            self._send()
        self.fresh = False
        self.step += 1
        self.times.transmit = self.transmit_estimate

    def _receive(self) -> None:
        if not self.have_inbox:
            if self.receiving is None:
                self.receiving = dist.irecv(self.inbox, self.prev)
            with self.timed("wait"):
                self.wait(self.receiving, "the model from the previous learner", self.prev)
            self.receiving = None
        self.have_inbox = False

    def _decode(self) -> torch.Tensor:
        inbox = self.inbox.to(self.device, copy=True)
        if self.ref_in is None:
            return inbox.view(torch.float32)
        self.ref_in = self.ref_in + self.compressor.decompress(inbox, self.numel)
        return self.ref_in

    def _send(self) -> None:
        with self.timed("wait"):
            self.wait(self.sending, "the next learner to take the model", self.next)
        with self.timed("merge"):
            params = flat_params(self.model)
            if self.ref_out is None:
                self.outbox.copy_(params.view(torch.uint8))
            else:
                self.outbox.copy_(self.compressor.compress(params - self.ref_out))
                self.ref_out = self.ref_out + self.compressor.decompress(self.outbox.to(self.device), self.numel)
        self.sending = dist.isend(self.outbox, self.next)
        self.times.bytes += self.outbox.numel()

    def quiesce(self) -> None:
        """Learner 0 takes in the model the last learner sent; every send completes."""
        if self.world == 1:
            return
        if self.rank == 0 and not self.fresh and not self.have_inbox:
            self._receive()
            self.have_inbox = True
        self.wait(self.sending, "the next learner to take the model", self.next)
        self.sending = None

    def synchronise(self) -> None:
        """The model ends its trip at learner 0, which broadcasts it; learner 0 holds it next."""
        if self.world == 1:
            return
        self.quiesce()
        if self.rank == 0 and self.have_inbox:
            load_params(self.model, self._decode())
            self.have_inbox = False
        params = flat_params(self.model)
        self.collective("the end-of-epoch model broadcast", dist.broadcast, params, 0)
        load_params(self.model, params)
        if self.ref_in is not None:
            self.ref_in, self.ref_out = params.clone(), params.clone()
        self.fresh = True
        self.transmit_estimate = self._measure_transmit()

    def _measure_transmit(self) -> float:
        """One-way time of a model message from learner 0 to 1 (half a ping-pong, best of 3), shared by all."""
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            if self.rank == 0:
                self.wait(dist.isend(self.outbox, 1), "a timing ping", 1)
                self.wait(dist.irecv(self.inbox, 1), "a timing pong", 1)
            elif self.rank == 1:
                self.wait(dist.irecv(self.inbox, 0), "a timing ping", 0)
                self.wait(dist.isend(self.outbox, 0), "a timing pong", 0)
            best = min(best, (time.perf_counter() - start) / 2)
        value = torch.tensor([best if self.rank == 0 else 0.0], dtype=torch.float64, device=self.device)
        self.collective("the timing broadcast", dist.broadcast, value, 0)
        return float(value)

    def state_dict(self) -> dict[str, Any]:
        state = {**super().state_dict(), "fresh": self.fresh, "have_inbox": self.have_inbox,
                 "transmit_estimate": self.transmit_estimate}
        if self.have_inbox:
            state["inbox"] = self.inbox.clone()
        if self.ref_in is not None:
            state["ref_in"], state["ref_out"] = self.ref_in, self.ref_out
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.fresh, self.have_inbox = bool(state["fresh"]), bool(state["have_inbox"])
        self.transmit_estimate = float(state.get("transmit_estimate", 0.0))
        if self.have_inbox:
            self.inbox.copy_(state["inbox"].to(self.wire))
        if "ref_in" in state and self.ref_in is not None:
            self.ref_in, self.ref_out = state["ref_in"].to(self.device), state["ref_out"].to(self.device)

    def close(self) -> None:
        self.quiesce() if self.world > 1 else None
