"""Convergence emulation: n virtual learners in one process, in each strategy's update order.

How fast a strategy runs on n machines is the timing model's business
(:mod:`asrflow.parallel.timing`); how well it *learns* with n learners — stale gradients,
averaged models, lossy compression — does not need n machines. :func:`emulate` keeps one
model (and optimiser) per learner and replays the exchanges of the real strategies, so held-out
frame accuracy after a fixed number of epochs can be compared across strategies and learner counts.

Learners act in lock-step rounds; within a round in rank order 0..n-1. Learner r reads the
batches ``BucketBatchSampler(lengths, max_frames, seed, rank=r, world=n)`` gives it, the same
as under ``torchrun``; a pipeline's stages all read the one-learner batches, one per round (a tick).
Every learner has its own AdamW, learning-rate schedule (stepped once per step it applies) and
gradient clipping; with one learner every strategy is plain training.
Only parameters are exchanged (as in :mod:`asrflow.parallel.base`); buffers stay per model.
No mixed precision: the emulation runs in float32 on ``device``.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch.func import functional_call

from asrflow.config.settings import Parallel, Training
from asrflow.nnet.data import BucketBatchSampler, FeatureDataset, chunk_batch, collate
from asrflow.nnet.models import build_model
from asrflow.nnet.objectives import OBJECTIVES
from asrflow.nnet.train import Schedule, adamw, evaluate, newbob_update, run_steps
from asrflow.parallel import overlap_conflict, staleness
from asrflow.parallel.base import flat_grads, flat_params, load_grads, load_params
from asrflow.parallel.compress import COMPRESSIONS, ErrorFeedback, make_compressor
from asrflow.parallel.pipeline import (
    _Stage,
    balance,
    layer_units,
    stashed_weights,
    step_recording,
    unit_costs,
)
from asrflow.parallel.topology import pairs

STRATEGIES = ("allreduce", "ring", "kavg", "adpsgd", "hierarchical", "asgd", "pipeline")
COMPRESSIBLE = ("allreduce", "ring", "kavg")  # the strategies that can compress what they send

_LOSS = OBJECTIVES["hybrid"]


@dataclass
class EmulationResult:
    """Held-out loss and frame accuracy of the final model of one emulated run."""

    strategy: str
    learners: int
    epochs: int
    valid_loss: float
    valid_frame_accuracy: float
    steps: int  # steps per learner

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class _Learner:
    """One model with its own AdamW, learning-rate schedule and gradient clipping."""

    def __init__(self, model: torch.nn.Module, opts: Training, schedule: Schedule) -> None:
        self.model, self.clip = model, opts.clip
        self.optimiser = adamw(model.parameters(), next(model.parameters()).device, opts.lr, opts.weight_decay)
        self.schedule = copy.copy(schedule)  # its own newbob scale
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimiser, self.schedule)

    def backward(self, batch: dict) -> float:
        """Fresh gradients of the frame cross-entropy on ``batch``; returns the loss."""
        self.optimiser.zero_grad()
        return _backward(self.model, batch)

    def step(self, clip: bool = True) -> None:
        """Clip the gradients (unless already clipped), take an optimiser step and a schedule step."""
        if clip:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        self.optimiser.step()
        self.scheduler.step()


def _backward(model: torch.nn.Module, batch: dict) -> float:
    logits, lengths = model(batch["feats"], batch["lengths"])
    loss, _ = _LOSS(logits, lengths, batch)
    loss.backward()
    return float(loss.detach())


def _mean_gradient(learner: _Learner, batches: list[dict], senders: list[ErrorFeedback] | None = None) -> float:
    """Gradients of ``learner``'s model averaged over ``batches`` (one per learner of a synchronous group),
    each first compressed by its learner's sender when ``senders`` are given; returns the mean loss."""
    if len(batches) == 1 and not senders:
        return learner.backward(batches[0])
    losses, grads = [], []
    for i, batch in enumerate(batches):
        losses.append(learner.backward(batch))
        grad = flat_grads(learner.model)
        grads.append(senders[i].decompress(senders[i].compress(grad)) if senders else grad)
    load_grads(learner.model, torch.stack(grads).mean(0))
    return sum(losses) / len(losses)


def _set_all(models: list[torch.nn.Module], flat: torch.Tensor) -> None:
    for model in models:
        load_params(model, flat)


def _average(models: list[torch.nn.Module]) -> None:
    """Every model's parameters become their mean."""
    if len(models) > 1:
        _set_all(models, torch.stack([flat_params(m) for m in models]).mean(0))


class _Emulator:
    """One strategy's learners; :meth:`round` runs one lock-step round, :meth:`end_epoch` synchronises."""

    learners: list[_Learner]  # whose learning-rate schedules the epoch-end newbob rule adjusts

    def round(self, batches: list[dict]) -> float:
        """Every learner's step on its batch (index = rank); returns the mean training loss."""
        raise NotImplementedError

    def end_epoch(self) -> None:
        """Leave every learner with the same model."""

    def model(self) -> torch.nn.Module:
        """The model everyone continues from (valid after :meth:`end_epoch`)."""
        return self.learners[0].model


class _AllReduce(_Emulator):
    """One model: gradients of all learners averaged (each compressed with error feedback), one update."""

    def __init__(self, initial: torch.nn.Module, n: int, opts: Training, compression: str,
                 device: torch.device, schedule: Schedule) -> None:
        self.learners = [_Learner(copy.deepcopy(initial), opts, schedule)]
        numel = sum(p.numel() for p in initial.parameters())
        self.senders = ([ErrorFeedback(make_compressor(compression), numel, device) for _ in range(n)]
                        if compression != "none" and n > 1 else None)

    def round(self, batches: list[dict]) -> float:
        loss = _mean_gradient(self.learners[0], batches, self.senders)
        self.learners[0].step()
        return loss


class _Ring(_Emulator):
    """RSPS: one model (the token) circulates 0→1→…→n-1→0; each holder applies its own gradient,
    computed on the token as it last held it (n-1 updates stale).

    Compressed, link r→r+1 sends the token as a delta against a reference both ends know
    (initially the initial model); both then set the reference to the receiver's reconstruction.
    The next delta is taken against that reconstruction, so it already carries what the last one
    missed: the reference is the link's error feedback (a residual on top would count the error twice).
    """

    def __init__(self, initial: torch.nn.Module, n: int, opts: Training, compression: str,
                 schedule: Schedule) -> None:
        self.learners = [_Learner(copy.deepcopy(initial), opts, schedule) for _ in range(n)]
        self.token = flat_params(initial)  # what the next holder receives
        self.compressor = make_compressor(compression) if compression != "none" and n > 1 else None
        self.references = [self.token.clone() for _ in range(n)]  # of link r → r+1

    def round(self, batches: list[dict]) -> float:
        losses = []
        for rank, learner in enumerate(self.learners):
            losses.append(learner.backward(batches[rank]))  # on its copy: the token as it last held it
            load_params(learner.model, self.token)  # take the token
            learner.step()
            self.token = self._send(rank, flat_params(learner.model))  # its copy is now the new token
        return sum(losses) / len(losses)

    def _send(self, rank: int, token: torch.Tensor) -> torch.Tensor:
        """What the next learner receives over link ``rank`` → ``rank + 1``."""
        if self.compressor is None:
            return token
        reference = self.references[rank]
        payload = self.compressor.compress(token - reference)
        self.references[rank] = reference + self.compressor.decompress(payload, token.numel())
        return self.references[rank]

    def end_epoch(self) -> None:
        token = flat_params(self.learners[-1].model)  # as its last holder has it, sent to everyone
        _set_all([learner.model for learner in self.learners], token)
        self.token = token
        self.references = [token.clone() for _ in self.learners]


class _KAvg(_Emulator):
    """Local steps; after every ``k`` of them (counted across epochs) and at epoch end the models are
    averaged (optimiser states stay local). Compressed, each learner sends its model's change since
    the last average (with error feedback); the mean change is added to that common reference.
    With ``overlap`` an average is taken in after the next local step: each learner's model becomes
    the average of the snapshots plus its own change since its snapshot."""

    def __init__(self, initial: torch.nn.Module, n: int, opts: Training, k: int, compression: str,
                 device: torch.device, schedule: Schedule, overlap: bool = False) -> None:
        self.learners = [_Learner(copy.deepcopy(initial), opts, schedule) for _ in range(n)]
        self.k, self.steps, self.since_average = k, 0, 0
        self.reference = flat_params(initial)
        self.senders = ([ErrorFeedback(make_compressor(compression), self.reference.numel(), device)
                         for _ in range(n)] if compression != "none" and n > 1 else None)
        self.overlap = overlap and n > 1
        self.pending: tuple[torch.Tensor, list[torch.Tensor]] | None = None  # (mean, snapshots)

    def round(self, batches: list[dict]) -> float:
        losses = []
        for learner, batch in zip(self.learners, batches):
            losses.append(learner.backward(batch))
            learner.step()
        self.steps += 1
        self.since_average += 1
        self._merge_pending()
        if self.steps % self.k == 0:
            if self.overlap:
                snapshots = [flat_params(learner.model) for learner in self.learners]
                self.pending, self.since_average = (torch.stack(snapshots).mean(0), snapshots), 0
            else:
                self._average()
        return sum(losses) / len(losses)

    def _merge_pending(self) -> None:
        if self.pending is not None:
            mean, snapshots = self.pending
            for learner, snapshot in zip(self.learners, snapshots):
                load_params(learner.model, mean + (flat_params(learner.model) - snapshot))
            self.pending = None

    def _average(self) -> None:
        models = [learner.model for learner in self.learners]
        if self.senders is None:
            _average(models)
        else:
            deltas = [s.decompress(s.compress(flat_params(m) - self.reference)) for s, m in zip(self.senders, models)]
            self.reference = self.reference + torch.stack(deltas).mean(0)
            _set_all(models, self.reference)
        self.since_average = 0

    def end_epoch(self) -> None:
        self._merge_pending()
        if self.since_average:
            self._average()


class _ADPSGD(_Emulator):
    """Each round every (super-)learner computes its gradient, pairs average their pre-update models,
    then each applies its own gradient; models are averaged at epoch end.

    With ``group_size`` > 1 (hierarchical) a super-learner is a group of consecutive ranks that
    averages its members' gradients and shares one model and optimiser (all-reduce inside a node).
    """

    def __init__(self, initial: torch.nn.Module, n: int, opts: Training, schedule: Schedule,
                 group_size: int = 1) -> None:
        self.group_size = group_size
        self.learners = [_Learner(copy.deepcopy(initial), opts, schedule) for _ in range(n // group_size)]
        self.rounds = 0  # counted across epochs: the pairing alternates with it

    def round(self, batches: list[dict]) -> float:
        size = self.group_size
        losses = [_mean_gradient(g, batches[i * size:(i + 1) * size]) for i, g in enumerate(self.learners)]
        partners = pairs(self.rounds, len(self.learners))
        if partners:
            before = [flat_params(g.model) for g in self.learners]
            for a, b in partners:
                _set_all([self.learners[a].model, self.learners[b].model], (before[a] + before[b]) / 2)
        for group in self.learners:
            group.step()
        self.rounds += 1
        return sum(losses) / len(losses)

    def end_epoch(self) -> None:
        _average([g.model for g in self.learners])


class _ASGD(_Emulator):
    """Parameter server: worker r computes (and clips) a gradient on the server model as it last pulled it,
    pushes it, the server's AdamW applies it, and r pulls the new model. Workers push in rank order,
    so a gradient is n-1 updates stale; the server's schedule steps once per applied gradient
    (the schedule's ``ticks`` of them per max_frames of data)."""

    def __init__(self, initial: torch.nn.Module, n: int, opts: Training, schedule: Schedule) -> None:
        self.learners = [_Learner(copy.deepcopy(initial), opts, schedule)]  # the server
        self.workers = [copy.deepcopy(initial) for _ in range(n)]
        self.clip = opts.clip

    def round(self, batches: list[dict]) -> float:
        server = self.learners[0]
        losses = []
        for worker, batch in zip(self.workers, batches):
            worker.zero_grad()
            losses.append(_backward(worker, batch))
            torch.nn.utils.clip_grad_norm_(worker.parameters(), self.clip)
            load_grads(server.model, flat_grads(worker))  # push
            server.step(clip=False)
            load_params(worker, flat_params(server.model))  # pull
        return sum(losses) / len(losses)


class _Pipeline(_Emulator):
    """Pipelined back-propagation over ``n`` stages (:class:`asrflow.parallel.pipeline.Pipeline`), tick by tick.

    One batch is fed per round. At tick t, stage s runs the forward pass of the batch fed at t - s on its
    current weights (its input is what stage s - 1 computed at the tick before); the last stage computes the
    loss, back-propagates and updates at once; stage s < n - 1 back-propagates the batch fed at
    t - 2 (n - 1) + s, 2 (n - 1 - s) ticks after its forward pass, through the weights of that forward pass
    (with the gradient stage s + 1 computed at the tick before) and updates. Every stage has its own AdamW,
    schedule and gradient clipping, and its own rate and weight prediction as ``rule`` says.
    """

    def __init__(self, initial: torch.nn.Module, n: int, opts: Training, rule: Parallel, schedule: Schedule) -> None:
        self.network = copy.deepcopy(initial)
        units = layer_units(self.network)  # sharing the network's modules
        bounds = balance(unit_costs(units), n)
        self.stages = [_Stage(units[bounds[s]:bounds[s + 1]]) for s in range(n)]
        self.learners = [_Learner(stage, dataclasses.replace(opts, lr=opts.lr * rule.lr_factor(n, s)),
                                  schedule) for s, stage in enumerate(self.stages)]
        self.stale = [staleness(n, s) for s in range(n)]
        self.deltas = [{name: torch.zeros_like(p) for name, p in stage.named_parameters()}
                       if rule.predict_weights and self.stale[s] else None for s, stage in enumerate(self.stages)]
        self.tick = 0
        self.fed: dict[int, dict] = {}  # batches by the tick they were fed at
        self.inputs: dict[tuple[int, int], torch.Tensor] = {}  # (stage, batch tick): its input activations
        self.grads: dict[tuple[int, int], torch.Tensor] = {}  # (stage, batch tick): the gradient of its output
        self.flight: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]] = {}

    def round(self, batches: list[dict]) -> float:
        self.fed[self.tick] = batches[0]
        return self._tick()

    def _tick(self) -> float:
        """One tick of every stage; returns the loss of the batch the last stage saw (nan while filling)."""
        t, last = self.tick, len(self.stages) - 1
        inputs, grads, loss = {}, {}, float("nan")
        for s, stage in enumerate(self.stages):
            if (b := t - s) in self.fed:
                batch = self.fed[b]
                x = (batch["feats"] if s == 0 else self.inputs.pop((s, b))).detach().requires_grad_(s > 0)
                stash = stashed_weights(stage, self.deltas[s], self.stale[s])
                y = functional_call(stage, stash, (x, batch["lengths"]))
                if s < last:
                    inputs[(s + 1, b)], self.flight[(s, b)] = y.detach(), (x, y, stash)
                else:
                    value, _ = _LOSS(y, batch["lengths"], batch)
                    value.backward()
                    loss = float(value.detach())
                    self._update(s, stash)
                    if s > 0:
                        grads[(s - 1, b)] = x.grad
            if s < last and (key := (s, t - 2 * last + s)) in self.flight:
                x, y, stash = self.flight.pop(key)
                y.backward(self.grads.pop(key))
                self._update(s, stash)
                if s > 0:
                    grads[(s - 1, key[1])] = x.grad
        self.inputs.update(inputs)
        self.grads.update(grads)
        self.fed = {b: batch for b, batch in self.fed.items() if b > t - 2 * last}
        self.tick += 1
        return loss

    def _update(self, s: int, stash: dict[str, torch.Tensor]) -> None:
        learner, delta = self.learners[s], self.deltas[s]
        learner.optimiser.zero_grad(set_to_none=True)
        for name, p in self.stages[s].named_parameters():
            p.grad = stash[name].grad
        step_recording(self.stages[s], delta, learner.step)

    def end_epoch(self) -> None:
        """Drain: tick without new batches until every stage has back-propagated every batch."""
        while self.fed:
            self._tick()

    def model(self) -> torch.nn.Module:
        return self.network


def _check(strategy: str, learners: int, k: int, group_size: int, compression: str, train_set: FeatureDataset,
           overlap: bool = False) -> None:
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown parallel strategy {strategy!r}; known: {', '.join(STRATEGIES)}")
    if learners < 1:
        raise ValueError(f"learners must be at least 1, not {learners}")
    if compression not in COMPRESSIONS:
        raise ValueError(f"unknown compression {compression!r}; known: {', '.join(COMPRESSIONS)}")
    if compression != "none" and strategy not in COMPRESSIBLE:
        raise ValueError(f"compression {compression!r} is supported by {', '.join(COMPRESSIBLE)} only, not {strategy}")
    if strategy == "kavg" and k < 1:
        raise ValueError(f"kavg needs k >= 1 local steps between averages, not {k}")
    if overlap and (problem := overlap_conflict(strategy, compression)):
        raise ValueError(problem)
    if strategy == "hierarchical" and learners > 1 and (group_size < 1 or learners % group_size):
        raise ValueError(f"hierarchical needs learners ({learners}) divisible by the group size ({group_size})")
    if train_set.targets is None or not train_set.frame_targets:
        raise ValueError("emulation trains the hybrid objective: the training set needs frame targets")


def _emulator(strategy: str, initial: torch.nn.Module, n: int, opts: Training, k: int, group_size: int,
              compression: str, device: torch.device, rule: Parallel, total: float, overlap: bool = False) -> _Emulator:
    """The strategy's emulator; ``total``: the run's length in schedule steps (the exponential schedule's)."""
    def schedule(server: bool = False) -> Schedule:  # the trainer's learning-rate schedule, per learner update
        return Schedule.of(opts, rule.schedule_ticks(n, server), total)

    if strategy == "allreduce":
        return _AllReduce(initial, n, opts, compression, device, schedule())
    if strategy == "ring":
        return _Ring(initial, n, opts, compression, schedule())
    if strategy == "kavg":
        return _KAvg(initial, n, opts, k, compression, device, schedule(), overlap)
    if strategy == "adpsgd":
        return _ADPSGD(initial, n, opts, schedule())
    if strategy == "hierarchical":
        return _ADPSGD(initial, n, opts, schedule(), group_size if n > 1 else 1)
    if strategy == "pipeline":
        return _Pipeline(initial, n, opts, rule, schedule())
    return _ASGD(initial, n, opts, schedule(server=True))


def _batch(dataset: FeatureDataset, indices: list[int], opts: Training, device: torch.device) -> dict:
    batch = collate([dataset[int(i)] for i in indices])
    if opts.chunk_frames:
        batch = chunk_batch(batch, opts.chunk_frames)
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def _held_out(model: torch.nn.Module, valid_set: FeatureDataset, opts: Training,
              device: torch.device) -> tuple[float, float]:
    """Held-out frame cross-entropy and frame accuracy (float32, no autocast)."""
    loss, accuracy = evaluate(model, valid_set, opts.max_frames, "hybrid", device)
    return loss, accuracy or 0.0


def emulate(strategy: str, learners: int, model_config: dict, train_set: FeatureDataset, valid_set: FeatureDataset,
            num_classes: int, opts: Training, k: int = 4, group_size: int = 2, compression: str = "none",
            log: Callable[[str], None] = lambda m: None, device: torch.device | str = "cpu",
            batch: str = "global", stale_lr: str = "sqrt", overlap: bool = False,
            predict_weights: bool = True) -> EmulationResult:
    """Train ``learners`` virtual learners with ``strategy`` for ``opts.epochs`` epochs (no early stopping)
    and return the final model's held-out loss and frame accuracy on ``valid_set``.

    ``k``: kavg's local steps between averages; ``group_size``: hierarchical's learners per group
    (must divide ``learners``); ``compression`` (``none``, ``1bit``, ``8bit``) applies to allreduce,
    ring and kavg only; ``batch`` splits ``opts.max_frames`` over the learners as the trainer does
    (:meth:`asrflow.config.settings.Parallel.learner_frames`) and ``stale_lr`` scales the
    ring's, asgd's and a pipeline's stages' rates as it does (:meth:`~asrflow.config.settings.Parallel.lr_factor`).
    The held-out set is evaluated after every epoch (logged; the newbob schedule
    reacts to it as in training). ``overlap`` takes kavg's averages in one step late, as the trainer's
    ``nnet.parallel.overlap`` does. With ``pipeline`` the learners are the stages of one network (a feed-forward
    hybrid with at least as many layers with weights), fed one ``max_frames`` batch per tick, with
    ``predict_weights`` as the trainer's ``nnet.parallel.predict_weights``.
    """
    _check(strategy, learners, k, group_size, compression, train_set, overlap)
    rule = Parallel.defaults(strategy=strategy, batch=batch, stale_lr=stale_lr, predict_weights=predict_weights)
    frames = rule.learner_frames(opts.max_frames, learners)
    if strategy != "pipeline":  # whose stages' rates differ
        opts = dataclasses.replace(opts, lr=opts.lr * rule.lr_factor(learners))
    readers = 1 if strategy == "pipeline" else learners  # a pipeline's stages read the same batches
    samplers = [BucketBatchSampler(train_set.lengths, frames, opts.seed, rank, readers)
                for rank in range(readers)]
    if len(samplers[0].batches) < readers:
        raise ValueError(f"{len(samplers[0].batches)} batches of at most {opts.max_frames} frames cannot give "
                         f"each of {learners} learners one")
    device = torch.device(device)
    torch.manual_seed(opts.seed)
    initial = build_model(model_config, train_set[0][1].shape[1], num_classes).to(device)
    total = run_steps(opts.epochs, len(samplers[0]), readers, frames, opts.max_frames)
    emulator = _emulator(strategy, initial, learners, opts, k, group_size, compression, device, rule, total, overlap)
    steps, last = 0, float("inf")
    valid_loss, valid_acc = float("inf"), 0.0
    for epoch in range(opts.epochs):
        for sampler in samplers:
            sampler.set_epoch(epoch)
        per_rank = [sampler.epoch_batches() for sampler in samplers]
        losses = [emulator.round([_batch(train_set, per_rank[r][t], opts, device) for r in range(readers)])
                  for t in range(len(per_rank[0]))]
        steps += len(losses)
        losses = [value for value in losses if value == value] or [float("nan")]  # a pipeline filling: none
        emulator.end_epoch()
        valid_loss, valid_acc = _held_out(emulator.model(), valid_set, opts, device)
        log(f"{strategy} x{learners} epoch {epoch}: training loss {sum(losses) / len(losses):.4f}, "
            f"held-out loss {valid_loss:.4f}, frame accuracy {valid_acc:.4f}")
        for learner in emulator.learners:
            if newbob_update(learner.schedule, last, valid_loss, opts):
                for group, base in zip(learner.optimiser.param_groups, learner.scheduler.base_lrs):
                    group["lr"] = base * learner.schedule(learner.scheduler.last_epoch)
        last = valid_loss
    if opts.epochs < 1:  # nothing trained: the initial model
        valid_loss, valid_acc = _held_out(emulator.model(), valid_set, opts, device)
    return EmulationResult(strategy, learners, opts.epochs, valid_loss, valid_acc, steps)
