"""What every parallel strategy shares: options, flat views of a model, timed waits that fail
with a message naming the stuck rank, and per-step timing.

A strategy drives one learner's step in three calls from the trainer::

    strategy.begin_step()        # post receives / sends that overlap the computation
    loss.backward()              # the trainer's forward and backward pass (T_calc)
    strategy.finish_step()       # exchange, merge and apply the gradient (T_transmit, T_merge, T_wait)

and ``synchronise()`` at the end of every epoch leaves every learner with the same model
(held-out evaluation, checkpoints and the final model need one). ``quiesce()`` before a
mid-epoch checkpoint completes everything in flight, and ``state_dict()`` then holds what
a restart needs (e.g. a ring's model in transit).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from asrflow.config.settings import Parallel
from asrflow.parallel import ParallelError
from asrflow.parallel.timing import StepTimes


def flat_params(model: torch.nn.Module) -> torch.Tensor:
    """All parameters as one new flat float32 vector."""
    return torch.cat([p.detach().reshape(-1).float() for p in model.parameters()])


def load_params(model: torch.nn.Module, flat: torch.Tensor) -> None:
    """Copy a flat vector (as from :func:`flat_params`) into the parameters."""
    offset = 0
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(flat[offset:offset + p.numel()].view_as(p))
            offset += p.numel()


def flat_grads(model: torch.nn.Module) -> torch.Tensor:
    """All gradients as one flat vector (zeros for parameters without one)."""
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1).float()
                      for p in model.parameters()])


def load_grads(model: torch.nn.Module, flat: torch.Tensor) -> None:
    """Copy a flat vector into the parameters' gradients."""
    offset = 0
    for p in model.parameters():
        chunk = flat[offset:offset + p.numel()].view_as(p).to(p.dtype)
        if p.grad is None:
            p.grad = chunk.clone()
        else:
            p.grad.copy_(chunk)
        offset += p.numel()


class Strategy:
    """One learner's side of a parallel strategy; with one learner it is plain SGD.

    Subclasses override :meth:`begin_step`, :meth:`finish_step` and, when learners' models
    can differ, :meth:`synchronise`. ``times`` holds the last step's :class:`StepTimes`
    (the trainer fills in ``calc`` and ``data``).
    """

    name = "single"
    compressible = False
    drives_steps = False  # True: the trainer hands each batch to train_step instead of running the passes itself

    def __init__(self, model: torch.nn.Module, optimiser: torch.optim.Optimizer, scheduler: Any,
                 opts: Parallel, rank: int, world: int, device: torch.device, clip: float) -> None:
        self.model, self.optimiser, self.scheduler = model, optimiser, scheduler
        self.opts, self.rank, self.world, self.device, self.clip = opts, rank, world, device, clip
        self.times = StepTimes()
        self.step = 0  # steps finished by this learner (over all epochs)
        # where point-to-point messages live: on the GPU for NCCL, on the CPU when gloo carries everything
        # (it sends and receives CPU tensors only; its all-reduce and broadcast take CUDA ones)
        self.wire = torch.device("cpu") if device.type == "cuda" and opts.backend == "gloo" else device
        self._store = _default_store() if world > 1 else None

    # --- the step -------------------------------------------------------------------------
    def begin_step(self) -> None:
        """Start of a step, before the forward pass."""
        self.times = StepTimes()
        self.announce("compute")

    def announce(self, phase: str) -> None:
        """Write ``<step>:<phase>`` to the rendezvous store: who is behind when a wait times out."""
        if self._store is not None:
            self._store.set(f"asrflow/step/{self.rank}", f"{self.step}:{phase}")

    def finish_step(self) -> None:
        """After the backward pass: exchange what the strategy exchanges and update the model."""
        with self.timed("merge"):
            self.apply_gradient()
        self.step += 1

    def apply_gradient(self) -> None:
        """Clip the gradient and take one optimiser step on the current parameters."""
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        self.optimiser.step()

    def synchronise(self) -> None:
        """End of an epoch: every learner ends with the same model."""

    def quiesce(self) -> None:
        """Before a mid-epoch checkpoint: finish every transfer in flight."""

    def close(self) -> None:
        """End of training: release threads and buffers."""

    def state_dict(self) -> dict[str, Any]:
        """What a restart needs beyond the model and optimiser (tensors and numbers only)."""
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.step = int(state.get("step", 0))

    # --- helpers for subclasses -----------------------------------------------------------
    @contextmanager
    def timed(self, field: str) -> Iterator[None]:
        """Add the block's wall time to ``self.times.<field>`` (synchronising a GPU first when several
        learners time their exchanges; one learner never waits for its GPU)."""
        start = time.perf_counter()
        yield
        if self.device.type == "cuda" and self.world > 1:
            torch.cuda.synchronize(self.device)
        setattr(self.times, field, getattr(self.times, field) + time.perf_counter() - start)

    def wait(self, work: Any, what: str, peer: int | None = None) -> None:
        """Wait for an asynchronous operation; past ``timeout`` fail naming the stuck learner."""
        if work is None:
            return
        self.announce("exchange")
        try:
            work.wait(timeout=timedelta(seconds=self.opts.timeout))
        except RuntimeError as exc:
            raise ParallelError(self.stuck_message(what, peer, exc)) from None

    def collective(self, what: str, call: Any, *args: Any, **kwargs: Any) -> None:
        """Run a ``torch.distributed`` collective asynchronously and :meth:`wait` for it."""
        self.announce("exchange")
        try:
            work = call(*args, async_op=True, **kwargs)
        except RuntimeError as exc:
            raise ParallelError(self.stuck_message(what, None, exc)) from None
        self.wait(work, what)

    def stuck_message(self, what: str, peer: int | None, exc: BaseException) -> str:
        """Which learner is behind: the heartbeat steps every learner writes to the rendezvous store."""
        steps = learner_steps(self._store, self.world)
        known = {r: s for r, s in steps.items() if s is not None}
        # behind: the lowest step, and among those the learners not waiting on an exchange
        lowest = min((s[0] for s in known.values()), default=None)
        behind = [r for r, s in known.items() if s[0] == lowest and s[1] != "exchange"] or \
                 [r for r, s in known.items() if s[0] == lowest and r != self.rank]
        where = ", ".join(f"rank {r} " + (f"in step {s[0]} ({s[1]})" if s else "silent") for r, s in steps.items())
        suspect = peer if peer is not None else (behind[0] if behind else None)
        return (f"{self.name}: rank {self.rank} (step {self.step}) waited more than {self.opts.timeout:g} s for {what}"
                + (f"; rank {suspect} is stuck or died" if suspect is not None else "")
                + (f" (learners: {where})" if where else "") + f" [{str(exc).splitlines()[0][:160]}]")


def _default_store() -> Any:
    """The rendezvous key-value store of the default process group (None when there is none)."""
    try:
        return dist.distributed_c10d._get_default_store()
    except (RuntimeError, AttributeError, ValueError):
        return None


def learner_steps(store: Any, world: int) -> dict[int, tuple[int, str] | None]:
    """(step, phase) each rank last announced (None when it never did or the store is unreachable)."""
    steps: dict[int, tuple[int, str] | None] = {}
    for rank in range(world):
        try:
            store.set_timeout(timedelta(seconds=2))
            step, phase = store.get(f"asrflow/step/{rank}").decode().split(":")
            steps[rank] = (int(step), phase)
        except Exception:  # noqa: BLE001 - a dead store or a missing key both mean "unknown"
            steps[rank] = None
    return steps
