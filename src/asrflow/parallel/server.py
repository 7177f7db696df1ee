"""``asgd``: parameter-server asynchronous SGD, the traditional scheme, kept as a baseline.

Learner 0 also runs the server, in a thread with its own process group: it holds the
reference model and the one optimiser. Every learner computes a gradient on its copy,
pushes it to the server, which applies gradients one at a time in arrival order, and pulls
the new model back. Gradients are as stale as the number of other learners' pushes since
the pull. The server's links and its serial updates are the bottleneck, so the scheme
stops scaling early (:func:`asrflow.parallel.timing.predict_speedup`).
"""

from __future__ import annotations

import copy
import inspect
import threading
from typing import Any

import torch
import torch.distributed as dist

from asrflow.parallel.base import Strategy, flat_grads, flat_params, load_grads, load_params

PUSH, DONE = 0.0, 1.0


class ParameterServer:
    """The server's model, optimiser and learning-rate schedule, guarded by a lock."""

    def __init__(self, model: torch.nn.Module, optimiser: torch.optim.Optimizer, scheduler: Any, clip: float,
                 ticks: float = 1.0) -> None:
        self.model = copy.deepcopy(model)
        accepted = inspect.signature(type(optimiser)).parameters
        self.optimiser = type(optimiser)(self.model.parameters(),
                                         **{k: v for k, v in optimiser.defaults.items() if k in accepted})
        schedule = copy.deepcopy(scheduler.lr_lambdas[0])
        schedule.ticks = ticks  # gradients applied per max_frames of data (Parallel.schedule_ticks)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimiser, schedule)
        self.lock = threading.Lock()
        self.updates = 0

    def apply(self, grads: torch.Tensor) -> torch.Tensor:
        """Apply one (clipped) gradient; the new parameters."""
        with self.lock:
            load_grads(self.model, grads)
            self.optimiser.step()
            self.scheduler.step()
            self.updates += 1
            return flat_params(self.model)

    def state_dict(self) -> dict[str, Any]:
        with self.lock:
            return {"model": self.model.state_dict(), "optimiser": self.optimiser.state_dict(),
                    "scheduler": self.scheduler.state_dict(), "updates": self.updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        with self.lock:
            self.model.load_state_dict(state["model"])
            self.optimiser.load_state_dict(state["optimiser"])
            self.scheduler.load_state_dict(state["scheduler"])
            self.updates = int(state["updates"])


class ASGD(Strategy):
    """Push gradient, pull model, through the server thread on learner 0."""

    name = "asgd"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.numel = sum(p.numel() for p in self.model.parameters())
        self.server = (ParameterServer(self.model, self.optimiser, self.scheduler, self.clip,
                                       self.opts.schedule_ticks(self.world, server=True)) if self.rank == 0 else None)
        self.group = dist.new_group(backend="gloo") if self.world > 1 else None
        self.thread: threading.Thread | None = None
        self.failure: BaseException | None = None

    def _serve(self) -> None:
        """Server loop: apply pushes in arrival order until every other learner said it is done."""
        message = torch.empty(self.numel + 1)
        done = 0
        try:
            while done < self.world - 1:
                source = dist.recv(message, group=self.group)
                if message[-1].item() == DONE:
                    done += 1
                    continue
                dist.send(self.server.apply(message[:-1].to(self.device)).cpu(), source, group=self.group)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            self.failure = exc

    def finish_step(self) -> None:
        if self.server is not None and self.thread is None and self.world > 1:
            self.thread = threading.Thread(target=self._serve, name="asrflow-parameter-server", daemon=True)
            self.thread.start()
        with self.timed("merge"):
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
            grads = flat_grads(self.model)
        if self.server is not None:
            with self.timed("merge"):
                load_params(self.model, self.server.apply(grads))
        else:
            message = torch.cat([grads.cpu(), torch.tensor([PUSH])])
            with self.timed("transmit"):
                self.wait(dist.isend(message, 0, group=self.group), "the parameter server to take a gradient", 0)
            model = torch.empty(self.numel)
            with self.timed("wait"):
                self.wait(dist.irecv(model, 0, group=self.group), "the parameter server's model", 0)
            with self.timed("merge"):
                load_params(self.model, model.to(self.device))
            self.times.bytes += message.numel() * 4
        if self.failure is not None:
            raise self.failure
        self.step += 1

    def quiesce(self) -> None:
        """Every learner's push of this step has been applied (pushes are synchronous)."""
        if self.world > 1:
            self.collective("the checkpoint barrier", dist.barrier)

    def synchronise(self) -> None:
        """Everyone continues from the server's model."""
        if self.world == 1:
            return
        self.quiesce()
        params = flat_params(self.server.model) if self.server is not None else flat_params(self.model)
        self.collective("the end-of-epoch model broadcast", dist.broadcast, params, 0)
        load_params(self.model, params)

    def close(self) -> None:
        if self.world == 1:
            return
        if self.server is None:
            done = torch.zeros(self.numel + 1)
            done[-1] = DONE
            self.wait(dist.isend(done, 0, group=self.group), "the parameter server to take the end message", 0)
        elif self.thread is not None:
            self.thread.join(timeout=self.opts.timeout)

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), **({"server": self.server.state_dict()} if self.server is not None else {})}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if self.server is not None and "server" in state:
            self.server.load_state_dict(state["server"])
