"""Pipelined back-propagation: the network cut into consecutive stages, one per learner.

Every learner reads the same batches. At each tick, stage ``s`` runs the forward pass of the batch fed
``s`` ticks ago (its input arrives from stage ``s − 1``) and sends its output on; the last stage
computes the loss and back-propagates at once; stage ``s`` back-propagates a batch ``2 (S − 1 − s)``
ticks after its forward pass (the gradient of its output arrives from stage ``s + 1``) and updates its own
layers right away. A batch's gradient thus meets weights ``2 (S − 1 − s)`` updates newer than those it
was computed with: the lower the stage, the staler (the last stage none). Each stage keeps the weights
of every forward pass in flight and back-propagates through those (weight stashing), so each gradient
is the true gradient of the weights that computed the forward pass, applied late.

With fewer learners than layers, consecutive layers are grouped so that each stage's multiply-adds per
frame are as even as the layers allow (:func:`balance`; the output layer is often the heaviest).
Starting the pipeline costs ``S − 1`` ticks, draining it ``S − 1`` more for the backward passes; it is
drained at the end of every epoch (then every learner takes every stage's weights, so held-out
evaluation, checkpoints and ``final.pt`` see the whole network) and before a mid-epoch checkpoint.

With ``predict_weights`` a stage whose gradients are ``d`` updates stale runs each forward pass on its weights
extrapolated to when that gradient will be applied, ``w + d Δw`` with ``Δw`` its last update (weight
prediction), and stashes those: the gradient is taken where the weights are expected to be, not where they were.
Feed-forward hybrids only (DNN, CNN-TDNN without subsampling or multi-frame outputs).
"""

from __future__ import annotations

from collections import deque
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.func import functional_call

from asrflow.nnet.models import CNN, DNN, Unit
from asrflow.nnet.objectives import LossStats
from asrflow.parallel import ParallelError, staleness
from asrflow.parallel.base import Strategy


def layer_units(model: nn.Module) -> list[Unit]:
    """The network's layers in order, sharing its modules (:meth:`DNN.layer_units`, :meth:`CNN.layer_units`):
    only feed-forward networks at the full frame rate cut into frame-wise stages."""
    if (isinstance(model, DNN) and model.every == 1) or (
            isinstance(model, CNN) and model.every == 1 and all(s == 1 for s in model.strides)):
        return model.layer_units()
    raise ParallelError(f"strategy pipeline cuts feed-forward networks into stages (dnn, cnn without subsampling "
                        f"or multi-frame outputs), not a {type(model).__name__}")


def unit_costs(units: list[Unit]) -> list[int]:
    """Multiply-adds per frame of each unit (its weights: each is used once per frame in these layers)."""
    return [sum(p.numel() for p in unit.parameters() if p.dim() > 1) for unit in units]


def balance(costs: list[int], stages: int) -> list[int]:
    """Boundaries ``b`` (``stages + 1`` of them, ``b[0] = 0``, ``b[-1] = len(costs)``) cutting ``costs`` into
    consecutive groups, each with at least one unit of positive cost, whose largest sum is as small as possible
    (ties: the earlier cut). A unit without weights (a DNN's splicing) joins the group of the unit before it,
    or the first group."""
    weighted = [i for i, c in enumerate(costs) if c > 0]
    n = len(weighted)
    if not 1 <= stages <= n:
        raise ParallelError(f"strategy pipeline: {stages} stages for a network of {n} layers with weights")
    prefix = [0]
    for i in weighted:
        prefix.append(prefix[-1] + costs[i])
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(stages + 1)]  # best[k][i]: first i weighted units in k groups
    cut = [[0] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = 0
    for k in range(1, stages + 1):
        for i in range(k, n + 1):
            for j in range(k - 1, i):
                value = max(best[k - 1][j], prefix[i] - prefix[j])
                if value < best[k][i]:
                    best[k][i], cut[k][i] = value, j
    bounds = [n]
    for k in range(stages, 0, -1):
        bounds.append(cut[k][bounds[-1]])
    return [0, *(weighted[b] for b in bounds[::-1][1:-1]), len(costs)]


def stashed_weights(stage: nn.Module, delta: dict[str, torch.Tensor] | None, stale: int) -> dict[str, torch.Tensor]:
    """Copies of ``stage``'s parameters for one forward pass and its backward pass, requiring gradients:
    as they are, or extrapolated by ``stale`` times the last update ``delta`` (weight prediction)."""
    if not delta:
        return {name: p.detach().clone().requires_grad_() for name, p in stage.named_parameters()}
    return {name: (p.detach() + stale * delta[name]).requires_grad_() for name, p in stage.named_parameters()}


def step_recording(stage: nn.Module, delta: dict[str, torch.Tensor] | None, step: Any) -> None:
    """Run ``step()`` (an optimiser step on ``stage``'s gradients); with ``delta``, store the update it made."""
    before = {name: p.detach().clone() for name, p in stage.named_parameters()} if delta else {}
    step()
    for name, p in stage.named_parameters() if delta else ():
        delta[name] = p.detach() - before[name]


class _Stage(nn.Module):
    """Consecutive units run one after the other."""

    def __init__(self, units: list[Unit]) -> None:
        super().__init__()
        self.units = nn.ModuleList(units)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        for unit in self.units:
            x = unit(x, lengths)
        return x


class Pipeline(Strategy):
    """One learner's stage of pipelined back-propagation (see the module's docstring).

    The trainer hands every batch to :meth:`train_step` instead of running the forward and backward
    passes itself (``drives_steps``). The loss statistics a step returns are those of the batch whose
    backward pass this stage ran (they travel back with the gradients), so learner 0 logs the loss too.
    """

    name = "pipeline"
    drives_steps = True

    def __init__(self, model: torch.nn.Module, optimiser: torch.optim.Optimizer, scheduler: Any, opts: Any,
                 rank: int, world: int, device: torch.device, clip: float) -> None:
        super().__init__(model, optimiser, scheduler, opts, rank, world, device, clip)
        units = layer_units(model)
        self.bounds = balance(unit_costs(units), world)
        self.owner = [next(s for s in range(world) if self.bounds[s] <= i < self.bounds[s + 1])
                      for i in range(len(units))]
        self.units = units
        self.stage = _Stage(units[self.bounds[rank]: self.bounds[rank + 1]])
        self.tick = 0
        self.fed: deque[tuple[int, dict]] = deque()  # (tick fed, batch) not yet back-propagated here
        self.flight: dict[int, tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]] = {}
        self.sends: list[tuple[Any, torch.Tensor]] = []  # this tick's sends, with their tensors
        self.sends_before: list[tuple[Any, torch.Tensor]] = []
        self.latest = -1  # the tick the latest batch was fed at (the same on every learner)
        self.loss_fn: Any = None
        self.last = rank == world - 1
        self.stale = staleness(world, rank)
        self.delta: dict[str, torch.Tensor] | None = (  # this stage's last update, for weight prediction
            {name: torch.zeros_like(p) for name, p in self.stage.named_parameters()}
            if opts.predict_weights and self.stale else None)

    # --- messages between neighbouring stages ------------------------------------------------
    def _send(self, tensor: torch.Tensor, peer: int) -> None:
        shape = torch.tensor([tensor.dim(), *tensor.shape, *([0] * (4 - tensor.dim()))], dtype=torch.int64)
        data = tensor.detach().to(self.wire, torch.float32).contiguous()
        self.sends += [(dist.isend(shape, peer), shape), (dist.isend(data, peer), data)]  # kept alive until sent
        self.times.bytes += data.numel() * 4

    def _recv(self, peer: int, what: str) -> torch.Tensor:
        shape = torch.zeros(5, dtype=torch.int64)
        with self.timed("wait"):
            self.wait(dist.irecv(shape, peer), what, peer)
            data = torch.empty([int(d) for d in shape[1: 1 + int(shape[0])]], dtype=torch.float32, device=self.wire)
            self.wait(dist.irecv(data, peer), what, peer)
        return data.to(self.device)

    def _flush_sends(self, everything: bool = False) -> None:
        """Wait for the sends of the tick before this one (their receivers have posted the receives by now; waiting
        for this tick's would deadlock two neighbours sending to each other), or for every send."""
        done = self.sends if everything else self.sends_before
        for work, _ in done:
            self.wait(work, "a send to a neighbouring stage")
        self.sends_before, self.sends = ([], []) if everything else (self.sends, [])

    # --- one tick ----------------------------------------------------------------------------
    def train_step(self, batch: dict | None, loss_fn: Any) -> LossStats:
        """Feed ``batch`` (None: a drain tick) and run this stage's forward and backward work of the tick."""
        self.begin_step()
        self.loss_fn = loss_fn or self.loss_fn  # drain ticks bring none
        if batch is not None:
            self.fed.append((self.tick, batch))
            self.latest = self.tick
        s, stages = self.rank, self.world
        frames = int(batch["lengths"].sum()) if batch is not None else 0
        stats = LossStats(torch.zeros((), device=self.device, dtype=torch.float64), 0, None, frames)
        for fed_at, item in list(self.fed):
            if fed_at + s == self.tick:
                done = self._forward(fed_at, item, self.loss_fn)
                if done is not None:
                    stats = LossStats(done[0], done[1], done[2], frames)
        if not self.last:
            for fed_at, _ in list(self.fed):
                if fed_at + 2 * (stages - 1) - s == self.tick:
                    stats = self._backward(fed_at, frames)
        self._flush_sends()
        self.tick += 1
        self.step += 1
        return stats

    def _forward(self, fed_at: int, batch: dict, loss_fn: Any) -> tuple[torch.Tensor, int, Any] | None:
        """This stage's forward pass of a batch (the last stage: its loss and backward pass as well)."""
        lengths = batch["lengths"]
        x = batch["feats"] if self.rank == 0 else self._recv(self.rank - 1, "the activations of the stage before")
        x = x.detach().requires_grad_(self.rank > 0)
        stash = stashed_weights(self.stage, self.delta, self.stale)
        y = functional_call(self.stage, stash, (x, lengths))
        if not self.last:
            self._send(y, self.rank + 1)
            self.flight[fed_at] = (x, y, stash)
            return None
        loss, stats = loss_fn(y, lengths, batch)
        loss.backward()
        self._update(stash)
        if self.rank > 0:
            self._send(x.grad, self.rank - 1)
            self._send(torch.stack([stats.loss_sum.double(), torch.tensor(float(stats.count), dtype=torch.float64),
                                    (stats.correct if stats.correct is not None else torch.tensor(-1.0)).double()]
                                   ).float(), self.rank - 1)
        self._forget(fed_at)
        return stats.loss_sum, stats.count, stats.correct

    def _backward(self, fed_at: int, frames: int) -> LossStats:
        """Back-propagate a batch through the weights that computed its forward pass, and update."""
        x, y, stash = self.flight.pop(fed_at)
        grad = self._recv(self.rank + 1, "the gradient of the stage after")
        numbers = self._recv(self.rank + 1, "the loss of the stage after")
        y.backward(grad)
        self._update(stash)
        if self.rank > 0:
            self._send(x.grad, self.rank - 1)
            self._send(numbers, self.rank - 1)
        self._forget(fed_at)
        loss_sum, count, correct = numbers.double().tolist()
        return LossStats(torch.tensor(loss_sum, dtype=torch.float64), int(count),
                         torch.tensor(correct) if correct >= 0 else None, frames)

    def _update(self, stash: dict[str, torch.Tensor]) -> None:
        """The stashed weights' gradient onto this stage's parameters, then one optimiser step (clipped)."""
        with self.timed("merge"):
            self.optimiser.zero_grad(set_to_none=True)
            for name, p in self.stage.named_parameters():
                p.grad = stash[name].grad
            step_recording(self.stage, self.delta, self.apply_gradient)  # only this stage's parameters have gradients

    def _forget(self, fed_at: int) -> None:
        while self.fed and self.fed[0][0] <= fed_at:
            self.fed.popleft()

    # --- epoch ends and checkpoints ------------------------------------------------------------
    def drain(self) -> None:
        """Tick without new batches until every batch fed has been back-propagated by every stage (the same
        number of ticks on every learner), then wait for the last sends."""
        while self.tick <= self.latest + 2 * (self.world - 1):
            self.train_step(None, None)
        self._flush_sends(everything=True)

    def quiesce(self) -> None:
        self.drain()

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), **({"delta": self.delta} if self.delta else {})}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if self.delta and "delta" in state:
            self.delta = {name: value.to(self.device) for name, value in state["delta"].items()}

    def synchronise(self) -> None:
        """Drain, then every learner takes each stage's weights and buffers from the learner that trains it."""
        self.drain()
        for owner, unit in zip(self.owner, self.units):
            for tensor in [*unit.parameters(), *unit.buffers()]:
                self.collective("the stages' weights", dist.broadcast, tensor.data, src=owner)
