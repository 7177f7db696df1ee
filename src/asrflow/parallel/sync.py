"""Synchronous strategies: ``allreduce`` (gradients every step) and ``kavg`` (models every K steps).

Both can compress what goes on the wire (``1bit`` or ``8bit`` with error feedback): the
payloads are all-gathered and every learner decompresses and averages them, so learners
still end every exchange with identical numbers. Bytes counted are what one learner puts
on the wire per step under the ring algorithms gloo and NCCL use: ``2 (P-1)/P`` of the
vector for an all-reduce, ``P-1`` payloads for an all-gather.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.distributed as dist

from asrflow.parallel import ParallelError
from asrflow.parallel.base import Strategy, flat_grads, flat_params, load_grads, load_params
from asrflow.parallel.compress import ErrorFeedback, make_compressor


def allreduce_bytes(vector: torch.Tensor, size: int) -> float:
    """Bytes one learner puts on the wire in a ring all-reduce of ``vector`` over ``size`` learners."""
    return 2 * (size - 1) / size * vector.numel() * vector.element_size()


class _Exchange(Strategy):
    """Average a flat vector over all learners (optionally compressed) within ``group``."""

    compressible = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.numel = sum(p.numel() for p in self.model.parameters())
        self.compressor = make_compressor(self.opts.compression)
        self.feedback = (ErrorFeedback(self.compressor, self.numel, self.device)
                         if self.opts.compression != "none" else None)

    def average(self, vector: torch.Tensor, what: str, group: Any = None, size: int | None = None) -> torch.Tensor:
        """Mean of ``vector`` over the learners of ``group`` (all by default)."""
        size = size or self.world
        if size == 1:
            return vector
        if self.feedback is None:
            with self.timed("transmit"):
                self.collective(what, dist.all_reduce, vector, group=group)
            self.times.bytes += allreduce_bytes(vector, size)
            return vector / size
        with self.timed("merge"):
            payload = self.feedback.compress(vector)
            gathered = [torch.empty_like(payload) for _ in range(size)]
        with self.timed("transmit"):
            self.collective(what, dist.all_gather, gathered, payload, group=group)
        self.times.bytes += (size - 1) * payload.numel()
        with self.timed("merge"):
            return torch.stack([self.compressor.decompress(p, vector.numel()) for p in gathered]).mean(0)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), **({"feedback": self.feedback.state_dict()} if self.feedback else {})}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if self.feedback and "feedback" in state:
            self.feedback.load_state_dict(state["feedback"])


class AllReduce(_Exchange):
    """Synchronous data parallelism: every step averages the gradients, then every learner
    takes the same optimiser step (learners' models stay identical)."""

    name = "allreduce"

    def finish_step(self) -> None:
        with self.timed("merge"):
            grads = flat_grads(self.model)
        grads = self.average(grads, "the gradient all-reduce")
        with self.timed("merge"):
            load_grads(self.model, grads)
            self.apply_gradient()
        self.step += 1


class KAvg(_Exchange):
    """K-step averaging: learners take ``k`` local steps, then average their models.

    With ``adapt`` the learners average every ``max(1, round(k / sqrt(P)))`` steps and
    take a learning rate ``sqrt(P)`` times larger (more learners, larger effective batch,
    tighter coupling). With compression, what is averaged is each learner's change since
    the last average (with error feedback), applied to the shared reference model.

    With ``overlap`` an average does not stop the learner: it starts the all-reduce of a
    snapshot of its model and computes its next step meanwhile; after that step it takes
    the average plus its own change since the snapshot. The all-reduce, and a learner's
    lead over the slowest (which a blocking average spends waiting), hide behind one step's
    computation; the price is that the step after each average is computed on the learner's
    own model rather than on the average.
    """

    name = "kavg"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.k = self.opts.k
        if self.opts.adapt and self.world > 1:
            self.k = max(1, round(self.opts.k / math.sqrt(self.world)))
            for group in self.optimiser.param_groups:
                group["lr"] *= math.sqrt(self.world)
            if self.scheduler is not None:
                self.scheduler.base_lrs = [lr * math.sqrt(self.world) for lr in self.scheduler.base_lrs]
        self.reference = flat_params(self.model) if self.feedback else None
        self.pending: tuple[Any, torch.Tensor, torch.Tensor] | None = None  # overlap: (work, sum, snapshot)

    def finish_step(self) -> None:
        with self.timed("merge"):
            self.apply_gradient()
        self.step += 1
        self.merge_pending()
        if self.step % self.k == 0:
            self.start_average() if self.opts.overlap and self.world > 1 else self.average_models()

    def start_average(self) -> None:
        """Overlap: all-reduce a snapshot of the model in the background; :meth:`merge_pending` takes it in."""
        self.announce("exchange")
        with self.timed("merge"):
            snapshot = flat_params(self.model)
            total = snapshot.clone()
        try:
            work = dist.all_reduce(total, async_op=True)
        except RuntimeError as exc:
            raise ParallelError(self.stuck_message("the model all-reduce", None, exc)) from None
        self.times.bytes += allreduce_bytes(total, self.world)
        self.pending = (work, total, snapshot)

    def merge_pending(self) -> None:
        """Overlap: wait for the average in flight; the model becomes it plus this learner's change since."""
        if self.pending is None:
            return
        work, total, snapshot = self.pending
        self.pending = None
        with self.timed("transmit"):
            self.wait(work, "the model all-reduce")
        with self.timed("merge"):
            load_params(self.model, total / self.world + (flat_params(self.model) - snapshot))

    def average_models(self) -> None:
        """All-reduce the parameters (or the compressed changes since the last average)."""
        if self.world == 1:
            return
        with self.timed("merge"):
            params = flat_params(self.model)
        if self.reference is None:
            params = self.average(params, "the model all-reduce")
        else:
            self.reference = self.reference + self.average(params - self.reference, "the model all-gather")
            params = self.reference
        with self.timed("merge"):
            load_params(self.model, params)

    def synchronise(self) -> None:
        self.merge_pending()  # started at the last step: no change since, so every learner holds the average
        if self.step % self.k:
            self.average_models()

    def quiesce(self) -> None:
        self.merge_pending()

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), **({"reference": self.reference} if self.reference is not None else {})}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if self.reference is not None and "reference" in state:
            self.reference = state["reference"].to(self.device)
