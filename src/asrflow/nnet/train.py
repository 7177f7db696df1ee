"""One trainer for every neural acoustic model and objective (hybrid frame CE or CTC).

Runs as one process or under ``torchrun`` (``torch.distributed``: gloo on CPU, NCCL on GPU),
where a parallel strategy of :mod:`asrflow.parallel` (``nnet.parallel.strategy``) decides
how the learners exchange gradients or models. Checkpoints hold the full state of every
learner — model, optimiser, scheduler, RNG, the strategy's own state — and the epoch and
position inside it; learner 0 writes them atomically, from a snapshot in a background
thread, at every epoch end and, looking every ``checkpoint_every`` steps, once
``checkpoint_minutes`` have passed since the last; they
are loaded with ``weights_only=True``; a run killed at any point and restarted ends with
the same model as an uninterrupted one (exactly so for one learner and the synchronous
strategies). On a GPU the forward pass runs under bfloat16 autocast
(``amp``); losses are computed in float32.
"""

from __future__ import annotations

import copy
import hashlib
import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from asrflow.config.settings import Parallel, Training
from asrflow.nnet import NnetError
from asrflow.nnet.data import (
    BucketBatchSampler,
    ExampleDataset,
    FeatureDataset,
    ShuffledBatchSampler,
    chunk_batch,
    collate,
    loaded,
    spec_augment,
)
from asrflow.nnet.models import build_model, frame_context, parameter_count
from asrflow.nnet.objectives import OBJECTIVES
from asrflow.parallel.strategies import make_strategy, strategy_class

CHECKPOINT = "checkpoint.pt"


#: learning-rate schedules (``nnet.train.schedule``)
SCHEDULES = ("warmup_invsqrt", "newbob", "exponential")


class Schedule:
    """Learning-rate factor: linear warm-up, then inverse square-root decay (``warmup_invsqrt``),
    constant with newbob halving on a held-out plateau (``newbob``), or an exponential fall to
    ``final`` times the peak at the end of the run's ``total`` steps (``exponential``, Kaldi's
    nnet3 schedule from its initial to its final learning rate over a fixed number of epochs).

    Steps count ``nnet.train.max_frames`` of data, whoever read it: a holder that updates
    ``ticks`` times per such step (an ASGD server taking each learner's share) or ``1/ticks``
    (learners each reading ``max_frames``) steps its scheduler once per update all the same.
    A callable object, so ``LambdaLR.state_dict`` saves :attr:`scale` with the checkpoint.
    """

    def __init__(self, kind: str, warmup: int, ticks: float = 1.0, total: float | None = None,
                 final: float = 1.0) -> None:
        if kind not in SCHEDULES:
            raise ValueError(f"unknown learning-rate schedule {kind!r}; known: {', '.join(SCHEDULES)}")
        if kind == "exponential" and not (total and total > 0):
            raise ValueError("the exponential learning-rate schedule needs the run's length in steps")
        self.kind, self.warmup, self.scale, self.ticks = kind, max(warmup, 1), 1.0, ticks
        self.total, self.final = total, final

    @classmethod
    def of(cls, opts: Training, ticks: float, total: float) -> Schedule:
        """``opts``'s schedule for a run of ``total`` steps (:func:`run_steps`; an empty run counts one)."""
        return cls(opts.schedule, opts.warmup_steps, ticks, max(total, 1.0), opts.final_lr_factor)

    def __call__(self, tick: int) -> float:
        step = tick / self.ticks + 1
        ramp = min(step / self.warmup, 1.0)
        if self.kind == "newbob":
            return ramp * self.scale
        if self.kind == "exponential":
            return ramp * self.final ** min((step - 1) / self.total, 1.0)
        return min(ramp, math.sqrt(self.warmup / step))


def run_steps(epochs: int, batches: int, readers: int, frames: int, max_frames: int) -> float:
    """A run's length in schedule steps (``max_frames`` of data): ``epochs`` of ``batches`` per reader,
    ``readers`` learners (or one) each reading ``frames`` a batch."""
    return epochs * batches * readers * frames / max_frames


def newbob_update(schedule: Schedule, previous: float, current: float, opts: Training) -> bool:
    """Halve the newbob scale when the held-out loss improved by less than the threshold."""
    if schedule.kind != "newbob" or not math.isfinite(previous):
        return False
    if (previous - current) / abs(previous) < opts.newbob_threshold:
        schedule.scale *= opts.newbob_factor
        return True
    return False


def atomic_save(state: dict, path: Path) -> None:
    """``torch.save`` to a temporary file, then rename: a reader never sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def on_cpu(value: Any) -> Any:
    """A copy of ``value`` (nested dicts, lists and tuples) with every tensor cloned to the CPU: a snapshot
    that training may go on changing the original of."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {k: on_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(on_cpu(v) for v in value)
    return copy.deepcopy(value)


class CheckpointWriter:
    """Writes snapshots (:func:`on_cpu`) with :func:`atomic_save` in a background thread, one at a time, so that
    training goes on while a large model is written; :meth:`wait` for the last one (and its error, if any)."""

    def __init__(self) -> None:
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def write(self, state: dict, path: Path) -> None:
        """Snapshot ``state`` now; write it to ``path`` in the background (after the previous write)."""
        snapshot = on_cpu(state)
        self.wait()
        self.thread = threading.Thread(target=self._save, args=(snapshot, path), name="asrflow-checkpoint",
                                       daemon=True)
        self.thread.start()

    def _save(self, state: dict, path: Path) -> None:
        try:
            atomic_save(state, path)
        except BaseException as exc:  # noqa: BLE001  (raised again in the training thread by wait())
            self.error = exc

    def wait(self) -> None:
        """Until the last write has ended; raises its error."""
        if self.thread is not None:
            self.thread.join()
            self.thread = None
        if self.error is not None:
            error, self.error = self.error, None
            raise error


def weights_digest(weights: dict[str, torch.Tensor]) -> str:
    """A hash of a state dict's names and values (a checkpoint resumes only onto the same initial weights)."""
    digest = hashlib.sha256()
    for name, tensor in sorted(weights.items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


def _distributed(timeout: float = 1800.0, backend: str = "auto") -> tuple[int, int, torch.device]:
    """Rank, world size and device; joins the process group when started by ``torchrun``.

    ``auto``: gloo on CPU; on GPUs NCCL, one GPU per learner, with gloo beside it for the
    point-to-point strategies (ring, adpsgd, asgd). ``gloo``: gloo for every tensor, CUDA ones
    too, so that learners may share a GPU (learner i on GPU i mod n): how the strategies' GPU code
    runs with several learners on a one-GPU machine; slower than NCCL.
    """
    cuda = torch.cuda.is_available()
    gpus = torch.cuda.device_count() if cuda else 0
    device = learner_device(int(os.environ.get("LOCAL_RANK", 0)), gpus, share=backend == "gloo")
    if "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) > 1 and not dist.is_initialized():
        from datetime import timedelta

        groups = ("cpu:gloo,cuda:gloo" if backend == "gloo" else "cpu:gloo,cuda:nccl") if cuda else "gloo"
        dist.init_process_group(groups, timeout=timedelta(seconds=timeout))
    if cuda:
        torch.cuda.set_device(device)
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size(), device
    return 0, 1, device


def learner_device(local_rank: int, gpus: int, share: bool = False) -> torch.device:
    """The GPU of the node's ``local_rank``-th learner, or the CPU on a node without GPUs.

    NCCL takes one GPU per learner, so a node with GPUs but fewer than its learners is an
    error that says so (rather than CUDA's "invalid device ordinal" later); with ``share``
    (the gloo backend) learners take the GPUs in turn.
    """
    if gpus == 0:
        return torch.device("cpu")
    if share:
        return torch.device("cuda", local_rank % gpus)
    if local_rank >= gpus:
        raise NnetError(f"learner {local_rank} of this node has no GPU: the node has {gpus} GPU(s), and each "
                        f"learner needs its own (NCCL). Set nnet.parallel.learners to at most {gpus} per node, "
                        f"hide the GPUs (CUDA_VISIBLE_DEVICES=) to train on the CPU, or share them with "
                        f"nnet.parallel.backend: gloo (slower)")
    return torch.device("cuda", local_rank)


def adamw(parameters: Any, device: torch.device, lr: float, weight_decay: float = 0.01) -> torch.optim.AdamW:
    """AdamW with its fused kernel on CPU and CUDA: one pass over each parameter instead of a dozen tensor
    operations (the trainer, the bare loop of ``bench nnet --bare`` and the strategies' emulator share it)."""
    return torch.optim.AdamW(parameters, lr=lr, weight_decay=weight_decay, fused=device.type in ("cpu", "cuda"))


def _autocast(device: torch.device, enabled: bool):
    """bfloat16 autocast on a GPU (no loss scaling needed); a no-op context on CPU."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=enabled and device.type == "cuda")


class _BatchMaker:
    """Training batch (epoch, index) of the run (:func:`_make_batch`), the epoch's batch order drawn once per
    process and epoch: in the trainer's thread or a loader worker alike."""

    def __init__(self, dataset: FeatureDataset, sampler: BucketBatchSampler, opts: Training, objective: str,
                 rank: int, pin: bool) -> None:
        self.dataset, self.sampler, self.opts, self.objective, self.rank, self.pin = (dataset, sampler, opts,
                                                                                      objective, rank, pin)
        self.epoch, self.batches = -1, []

    def __call__(self, key: tuple[int, int]) -> dict:
        epoch, index = key
        if epoch != self.epoch:
            self.epoch, self.batches = epoch, self.sampler.epoch_batches(epoch)
        return _make_batch(self.dataset, self.batches, self.opts, self.objective, epoch, self.rank, index, self.pin)


def _make_batch(dataset: FeatureDataset, batches: list[list[int]], opts: Training, objective: str, epoch: int,
                rank: int, index: int, pin: bool = False) -> dict:
    """Training batch ``index`` of an epoch, on the CPU: read, padded, augmented (draws seeded by
    seed/epoch/batch/rank, so the same whenever it is made) and cut into chunks; pinned for a GPU."""
    batch = collate([dataset[i] for i in batches[index]])
    if opts.specaugment.enabled:
        key = np.random.SeedSequence([opts.seed, epoch, index, rank]).generate_state(1)[0]
        draws = torch.Generator().manual_seed(int(key))
        batch["feats"] = spec_augment(batch["feats"], batch["lengths"], opts.specaugment, draws)
    if opts.chunk_frames and objective == "hybrid":
        batch = chunk_batch(batch, opts.chunk_frames)
    if pin:
        batch = {k: v.pin_memory() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
    return batch


def _to(batch: dict, device: torch.device) -> dict:
    """The batch's tensors on ``device``, but its lengths on the CPU, where the objectives count frames
    without waiting for the GPU (the models move them where they need them)."""
    return {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) and not k.endswith("lengths") else v
            for k, v in batch.items()}


def evaluate(model: torch.nn.Module, dataset: FeatureDataset, max_frames: int, objective: str = "hybrid",
             device: torch.device | None = None, amp: bool = False,
             criterion: Callable | None = None) -> tuple[float, float | None]:
    """Held-out loss (per frame for hybrid, per utterance for CTC) and frame accuracy (hybrid), by
    ``criterion`` when given (a combined objective such as MMI's), else the objective's own loss."""
    device = device or torch.device("cpu")
    loss_fn = criterion or OBJECTIVES[objective]
    model.eval()
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    correct = torch.zeros((), dtype=torch.float64, device=device)
    count = 0
    sampler = BucketBatchSampler(dataset.lengths, max_frames, seed=0)
    with torch.no_grad(), _autocast(device, amp):
        for indices in sampler:
            batch = _to(collate([dataset[i] for i in indices]), device)
            logits, out_lengths = model(batch["feats"], batch["lengths"])
            _, stats = loss_fn(logits, out_lengths, batch)
            loss_sum += stats.loss_sum
            count += stats.count
            if stats.correct is not None:
                correct += stats.correct
    model.train()
    accuracy = float(correct) / max(count, 1) if objective == "hybrid" else None
    return float(loss_sum) / max(count, 1), accuracy


def _average(values: list[float], device: torch.device, world: int) -> list[float]:
    """Sum ``values`` over ranks (held-out statistics of each rank's part)."""
    if world == 1:
        return values
    tensor = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(tensor)
    return tensor.tolist()


def _learner_state(model: torch.nn.Module, optimiser: torch.optim.Optimizer, scheduler: Any, strategy: Any,
                   device: torch.device) -> dict:
    """One learner's part of a checkpoint; on a GPU with its CUDA generator (dropout masks are drawn there)."""
    state = {"model": model.state_dict(), "optimiser": optimiser.state_dict(), "scheduler": scheduler.state_dict(),
             "rng": torch.get_rng_state(), "strategy": strategy.state_dict()}
    if device.type == "cuda":
        state["cuda_rng"] = torch.cuda.get_rng_state(device)
    return state


# training options that change no result
RUNTIME_OPTIONS = ("prefetch", "checkpoint_minutes", "log_every", "loader_workers", "compile")
# options that only say when to stop or which epoch's model is final (no schedule but the exponential one
# depends on them): a run resumes with other values, to train on from its last epoch or to stop at one it has passed
STOPPING_OPTIONS = ("epochs", "patience", "keep")


def _resume_identity(model_config: dict[str, Any], opts: Training) -> tuple[list, list]:
    """The model config and training options a checkpoint must match to be resumed. The model's own
    ``train`` overrides are left to ``opts``, which holds them resolved."""
    # an exponential schedule falls over the planned epochs: their number changes every step's rate
    stopping = tuple(k for k in STOPPING_OPTIONS if not (k == "epochs" and opts.schedule == "exponential"))
    ignored = RUNTIME_OPTIONS + stopping
    return (sorted((k, v) for k, v in model_config.items() if k != "train"),
            sorted((k, v) for k, v in vars(opts).items() if k not in ignored))


def _gather(value: dict, rank: int, world: int) -> list[dict] | None:
    """Every learner's ``value`` on learner 0 (None elsewhere)."""
    if world == 1:
        return [value]
    values: list[Any] | None = [None] * world if rank == 0 else None
    dist.gather_object(value, values, dst=0)
    return values


def train(model_config: dict[str, Any], opts: Training, train_set: FeatureDataset, valid_set: FeatureDataset,
          num_classes: int, out_dir: str | Path, log_metrics: Callable[[int, dict], None] = lambda s, m: None,
          log: Callable[[str], None] = print, objective: str = "hybrid",
          extra: dict[str, Any] | None = None, state_dir: str | Path | None = None,
          parallel: Parallel | None = None, criterion: Callable | None = None,
          init: dict[str, Any] | None = None) -> dict[str, Any]:
    """Train (or resume) and write ``final.pt`` (the best held-out model, or the last with ``keep: last``);
    returns a summary.

    Checkpoints go to ``state_dir`` (default ``out_dir``); one written by a run with another
    model, objective, class count, options, strategy or learner count is ignored rather than
    resumed. ``epochs`` and ``patience`` only decide when to stop, so a run resumes across a
    change of either: more epochs train on from the last checkpoint, fewer end the run at the
    best model so far.

    ``objective`` is ``hybrid`` (frame cross-entropy on ``train_set``'s frame targets) or
    ``ctc`` (its unit sequences). ``extra`` is stored in ``final.pt`` beside the weights
    (e.g. the unit inventory), so a model file is self-describing. ``parallel`` chooses the
    strategy when several learners run under torchrun (default: all-reduce). ``criterion``
    replaces the objective's loss in training and held-out evaluation (hybrid MMI, ``nnet/mmi.py``).
    ``init`` (the content of another network's ``final.pt``, same shape) gives the starting weights
    instead of random ones (fine-tuning; without its output layer and class count, ``num_classes`` None,
    the layers below a new output layer: ``init_layers: encoder``); that starting model's held-out loss is the
    one to beat, so ``final.pt`` is never worse on the held-out set than where training began (unless ``keep`` is
    ``last``: then it is the weights after the last epoch trained, whatever their held-out loss).
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown objective {objective!r}; known: {', '.join(OBJECTIVES)}")
    run = _Run(model_config, opts, train_set, valid_set, num_classes, Path(out_dir), objective,
               parallel or Parallel.defaults(), criterion, init, state_dir, extra, log, log_metrics)
    run.resume()
    if init is not None and not run.resumed:  # the starting model's held-out loss is the one to beat
        run.start_from_init()
    run.started = time.perf_counter()
    while run.state["epoch"] < opts.epochs and run.state["bad_epochs"] < opts.patience:
        run.epoch()
    run.finish()
    return run.summary()


class _Run:
    """One learner's training run: the model, optimiser, schedule and strategy, its resumable state and totals."""

    def __init__(self, model_config: dict[str, Any], opts: Training, train_set: FeatureDataset,
                 valid_set: FeatureDataset, num_classes: int, out: Path, objective: str, parallel: Parallel,
                 criterion: Callable | None, init: dict[str, Any] | None, state_dir: str | Path | None,
                 extra: dict[str, Any] | None, log: Callable[[str], None],
                 log_metrics: Callable[[int, dict], None]) -> None:
        self.opts, self.train_set, self.objective, self.parallel = opts, train_set, objective, parallel
        self.loss_fn = criterion or OBJECTIVES[objective]
        self.log, self.log_metrics = log, log_metrics
        self.out = out
        out.mkdir(parents=True, exist_ok=True)
        self.rank, self.world, self.device = _distributed(parallel.timeout, parallel.backend)
        if opts.deterministic:
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # read when cuBLAS starts
            torch.use_deterministic_algorithms(True)
        self.model = self._model(model_config, num_classes, init)
        if hasattr(self.loss_fn, "attach"):  # an objective that reads more of the network than its outputs
            self.loss_fn.attach(self.model)
        torch.manual_seed(opts.seed + 7919 * self.rank)  # same initial model everywhere; own dropout masks per learner
        lr = opts.lr * parallel.lr_factor(self.world, self.rank)  # a pipeline's stages differ
        self.optimiser = adamw(self.model.parameters(), self.device, lr, opts.weight_decay)
        frames = parallel.learner_frames(opts.max_frames, self.world)
        # which share of the batches this learner reads: a pipeline's stages all read every batch
        self.reader = (0, 1) if strategy_class(parallel, self.world).drives_steps else (self.rank, self.world)
        if opts.example_frames:
            context = frame_context(self.model)
            if context is None or objective != "hybrid":
                raise NnetError(f"train.example_frames needs a feed-forward hybrid whose outputs see a bounded "
                                f"window (dnn, cnn without subsampling), not a {model_config.get('type')} "
                                f"{objective} network")
            train_set = self.train_set = ExampleDataset(train_set, opts.example_frames, context)
            self.sampler = ShuffledBatchSampler(train_set.lengths, frames, opts.seed, *self.reader)
        else:
            self.sampler = BucketBatchSampler(train_set.lengths, frames, opts.seed, *self.reader)
        total = run_steps(opts.epochs, len(self.sampler), self.reader[1], frames, opts.max_frames)
        self.schedule = Schedule.of(opts, parallel.schedule_ticks(self.world), total)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimiser, self.schedule)
        self.strategy = make_strategy(parallel, self.model, self.optimiser, self.scheduler, self.rank, self.world,
                                      self.device, opts.clip)
        self.state: dict[str, Any] = {"epoch": 0, "batch": 0, "step": 0, "best": float("inf"), "last": float("inf"),
                                      "bad_epochs": 0, "train_loss": 0.0, "train_count": 0}
        self.state_path = Path(state_dir) if state_dir else out
        self.state_path.mkdir(parents=True, exist_ok=True)
        self.checkpoint = self.state_path / CHECKPOINT
        input_dim = train_set[0][1].shape[1]
        # what a checkpoint must have been written with to be resumed (prefetching, when checkpoints are
        # written and when to stop change no step)
        config_identity, opts_identity = _resume_identity(model_config, opts)
        self.identity = repr((config_identity, objective, num_classes, input_dim, opts_identity,
                              len(train_set), self.world,
                              sorted(vars(parallel).items() - {("timeout", parallel.timeout)}),
                              weights_digest(init["model"]) if init is not None else None))
        self.header = {"config": dict(model_config), "num_classes": num_classes, "input_dim": input_dim,
                       "objective": objective, **(extra or {})}
        self.valid_part = valid_set.part(self.rank, self.world)
        self.resumed = False
        self.saved_at = time.monotonic()
        self.window = _Window()
        self.writer = CheckpointWriter()
        self.stream: Iterator[tuple[tuple[int, int], dict]] | None = None
        self.steps_per_epoch = len(self.sampler)
        self.forward = torch.compile(self.model, dynamic=True) if opts.compile else self.model
        # the whole run's totals and time, carried across resumes by the checkpoints
        self.totals = {"frames": 0.0, "data": 0.0, "calc": 0.0, "transmit": 0.0, "merge": 0.0, "wait": 0.0,
                       "bytes": 0.0, "steps": 0, "held_out": 0.0}
        self.seconds_before = 0.0  # training time of the runs this one resumed
        self.started = time.perf_counter()

    def _model(self, model_config: dict[str, Any], num_classes: int, init: dict[str, Any] | None) -> torch.nn.Module:
        """The network on this learner's device: seeded random weights, or ``init``'s."""
        torch.manual_seed(self.opts.seed)
        input_dim = self.train_set[0][1].shape[1]
        model = build_model(model_config, input_dim, num_classes).to(self.device)
        if init is not None:
            if init["input_dim"] != input_dim or init["num_classes"] not in (None, num_classes):
                raise NnetError(f"the initial weights are for {init['input_dim']}-dimensional input and "
                                f"{init['num_classes']} classes; this network has {input_dim}-dimensional input and "
                                f"{num_classes} classes")
            if init["num_classes"] is None:  # the layers below the output (init_layers: encoder): a new output
                missing, unexpected = model.load_state_dict(init["model"], strict=False)
                if unexpected or any(not k.startswith("output.") for k in missing):
                    raise NnetError(f"the initial weights do not fit this network's layers below its output "
                                    f"(missing {missing}, unexpected {unexpected})")
            else:
                model.load_state_dict(init["model"])
        return model

    def resume(self) -> None:
        """Continue from the checkpoint when one written with the same settings is there."""
        if not self.checkpoint.is_file():
            return
        saved = torch.load(self.checkpoint, weights_only=True, map_location=self.device)
        if saved.get("identity") != self.identity:
            self.log(f"ignoring {self.checkpoint}: written by a run with other settings")
            return
        mine = saved["learners"][self.rank]
        self.model.load_state_dict(mine["model"])
        self.optimiser.load_state_dict(mine["optimiser"])
        self.scheduler.load_state_dict(mine["scheduler"])
        self.strategy.load_state_dict(mine["strategy"])
        torch.set_rng_state(mine["rng"].cpu())
        if self.device.type == "cuda" and "cuda_rng" in mine:
            torch.cuda.set_rng_state(mine["cuda_rng"].cpu(), self.device)
        self.state, self.resumed = {**self.state, **saved["state"]}, True  # keys newer than the checkpoint start fresh
        self.totals.update(saved.get("totals", {}))
        self.seconds_before = saved.get("seconds", 0.0)
        self.log(f"resumed from {self.checkpoint}: epoch {self.state['epoch']}, batch {self.state['batch']}, "
                 f"step {self.state['step']}")

    def checkpoint_due(self) -> bool:
        """Whether ``checkpoint_minutes`` have passed since the last checkpoint, by learner 0's clock (every
        learner gets its answer: writing one is a collective)."""
        due = time.monotonic() - self.saved_at >= 60 * self.opts.checkpoint_minutes
        if self.world == 1:
            return due
        flag = torch.tensor([int(due)], dtype=torch.int32, device=self.device)
        # through the strategy, so that a stuck learner fails the job naming it
        self.strategy.collective("the checkpoint clock", dist.broadcast, flag, src=0)
        return bool(flag.item())

    def save(self) -> None:
        """A checkpoint of every learner's state, written by learner 0."""
        self.saved_at = time.monotonic()
        self.strategy.quiesce()
        learners = _gather(_learner_state(self.model, self.optimiser, self.scheduler, self.strategy, self.device),
                           self.rank, self.world)
        if self.rank == 0:
            self.writer.write({"learners": learners, "state": dict(self.state), "identity": self.identity,
                               "totals": dict(self.totals), "seconds": self.elapsed()}, self.checkpoint)

    def elapsed(self) -> float:
        """Seconds of training so far, the runs this one resumed included."""
        return self.seconds_before + time.perf_counter() - self.started

    def held_out(self) -> tuple[float, float | None]:
        """Held-out loss and frame accuracy over every learner's part."""
        return _held_out(self.model, self.valid_part, self.opts, self.objective, self.device, self.world, self.loss_fn)

    def keep_best(self) -> None:
        """Write the current model as the best so far (learner 0)."""
        if self.rank == 0:
            self.writer.write({"model": self.model.state_dict(), **self.header}, self.state_path / "best.pt")

    def start_from_init(self) -> None:
        """The initial weights' held-out loss is the first best."""
        self.state["best"], self.state["best_accuracy"] = self.held_out()
        self.state["last"] = self.state["best"]
        accuracy = self.state["best_accuracy"]
        self.log(f"initial weights: held-out loss {self.state['best']:.4f}"
                 + (f", frame accuracy {accuracy:.4f}" if accuracy is not None else ""))
        self.keep_best()

    def epoch(self) -> None:
        """The rest of the current epoch's steps, then its held-out evaluation and checkpoint."""
        if self.stream is None:
            self.stream = self.batch_stream()
        epoch = self.state["epoch"]
        self.window = _Window()  # the held-out pass and checkpoint since the last are not training time
        for _ in range(self.state["batch"], self.steps_per_epoch):
            t0 = time.perf_counter()  # the wait for the next batch is the step's data time
            (made_for, index), batch = next(self.stream)
            assert made_for == epoch and index == self.state["batch"], "the batch stream lost its place"
            self.step(index, batch, t0)
        self.strategy.synchronise()
        self.end_epoch()

    def step(self, index: int, batch: dict, t0: float) -> None:
        """One training step on ``batch`` (batch ``index`` of the epoch, read since ``t0``).

        With one learner nothing here waits for the GPU: the loss and accuracy are summed on the
        device and read every ``log_every`` steps (:meth:`flush_metrics`). With several, the
        step's computation is timed to the end (the timing model's T_calc) before the exchange.
        """
        batch = _to(batch, self.device)
        t1 = time.perf_counter()
        if self.strategy.drives_steps:  # pipelined: the strategy runs this stage's passes
            with _autocast(self.device, self.opts.amp):
                stats = self.strategy.train_step(batch, self.loss_fn)
            t2 = time.perf_counter()
            busy = self.strategy.times.wait + self.strategy.times.merge
        else:
            self.strategy.begin_step()
            with _autocast(self.device, self.opts.amp):
                logits, out_lengths = self.forward(batch["feats"], batch["lengths"])
            loss, stats = self.loss_fn(logits, out_lengths, batch)
            self.optimiser.zero_grad(set_to_none=True)
            loss.backward()
            if self.device.type == "cuda" and self.world > 1:
                torch.cuda.synchronize(self.device)
            t2 = time.perf_counter()
            self.strategy.finish_step()
            busy = 0.0
        self.scheduler.step()  # Schedule's ticks turn learner steps into steps of max_frames of data
        t3 = time.perf_counter()
        times = self.strategy.times
        times.data, times.calc = t1 - t0, t2 - t1 - busy
        self.state["step"] += 1
        self.state["batch"] = index + 1
        for key, value in (("frames", stats.frames), ("data", times.data), ("calc", times.calc),
                           ("transmit", times.transmit), ("merge", times.merge), ("wait", times.wait),
                           ("bytes", times.bytes), ("steps", 1)):
            self.totals[key] += value
        self.window.add(stats, t3 - t0, t1 - t0, times.as_dict() if self.world > 1 else {})
        if self.state["step"] % self.opts.log_every == 0:
            self.flush_metrics()
        if self.state["step"] % self.opts.checkpoint_every == 0 and self.checkpoint_due():
            self.flush_metrics()  # the epoch's training-loss sums in the checkpoint cover every step before it
            self.save()

    def flush_metrics(self) -> None:
        """Log the steps since the last flush (one read of the device's sums, which waits for the steps to end) and
        add their loss to the epoch's."""
        if self.window.steps:
            metrics = self.window.metrics(self.reader[1], self.scheduler.get_last_lr()[0])
            self.state["train_loss"] += metrics["loss"] * self.window.count
            self.state["train_count"] += self.window.count
            self.log_metrics(self.state["step"], metrics)
            self.window = _Window()

    def end_epoch(self) -> None:
        """Held-out evaluation, newbob, the best model and early stopping, then the epoch's checkpoint."""
        self.flush_metrics()
        state = self.state
        held_out_start = time.perf_counter()
        valid_loss, valid_acc = self.held_out()
        self.totals["held_out"] += time.perf_counter() - held_out_start
        train_loss = state["train_loss"] / state["train_count"] if state["train_count"] else None
        state["train_loss"], state["train_count"] = 0.0, 0
        self.log(f"epoch {state['epoch']}: "
                 + (f"training loss {train_loss:.4f}, " if train_loss is not None else "")
                 + f"held-out loss {valid_loss:.4f}"
                 + (f", frame accuracy {valid_acc:.4f}" if valid_acc is not None else "")
                 + f", lr {self.scheduler.get_last_lr()[0]:.2e}")
        self.log_metrics(state["step"], {"valid_loss": valid_loss, "epoch": state["epoch"],
                                         **({"epoch_train_loss": train_loss} if train_loss is not None else {}),
                                         **({"valid_frame_accuracy": valid_acc} if valid_acc is not None else {})})
        if newbob_update(self.schedule, state["last"], valid_loss, self.opts):
            for group, base in zip(self.optimiser.param_groups, self.scheduler.base_lrs):  # apply it at once
                group["lr"] = base * self.schedule(self.scheduler.last_epoch)
            self.log(f"newbob: learning-rate scale now {self.schedule.scale:g}")
        state["last"] = valid_loss
        if valid_loss < state["best"] - 1e-4:
            state["best"], state["bad_epochs"], state["best_accuracy"] = valid_loss, 0, valid_acc
            self.keep_best()
        else:
            state["bad_epochs"] += 1
        state["epoch"] += 1
        state["batch"] = 0
        self.save()

    def batch_stream(self) -> Iterator[tuple[tuple[int, int], dict]]:
        """Every remaining training batch of the run, keyed (epoch, index), from one loader that keeps its worker
        processes and keeps reading ahead across epoch ends (batches read for epochs that early stopping
        skips are dropped)."""
        first, start = self.state["epoch"], self.state["batch"]
        keys = [(e, i) for e in range(first, self.opts.epochs) for i in range(start if e == first else 0,
                                                                               self.steps_per_epoch)]
        cuda, workers = self.device.type == "cuda", self.opts.loader_workers
        make = _BatchMaker(self.train_set, self.sampler, self.opts, self.objective, self.rank, cuda and not workers)
        return loaded(make, keys, workers, self.opts.prefetch, pin=cuda)

    def finish(self) -> None:
        """Stop the batch stream and close the strategy; learner 0 writes the best model (or, with ``keep: last``,
        the current one) as ``final.pt``."""
        if self.stream is not None:
            self.stream.close()
        self.writer.wait()
        self.strategy.close()
        if self.rank == 0:
            best_path = self.state_path / "best.pt"
            best = None
            if self.opts.keep == "best" and best_path.is_file():
                best = torch.load(best_path, weights_only=True)
            atomic_save(best or {"model": self.model.state_dict(), **self.header}, self.out / "final.pt")

    def summary(self) -> dict[str, Any]:
        """Epochs, steps, the best held-out loss, throughput and the per-step times of the timing model, over the
        whole run (a resumed run's totals and time include those of the runs it resumed)."""
        totals, state, seconds = self.totals, self.state, self.elapsed()
        busy = max(totals["data"] + totals["calc"] + totals["transmit"] + totals["merge"] + totals["wait"], 1e-9)
        steps = max(totals["steps"], 1)
        return {"epochs": state["epoch"], "steps": state["step"], "best_valid_loss": state["best"],
                "best_valid_frame_accuracy": state.get("best_accuracy"),
                # the held-out loss of the model in final.pt
                "final_valid_loss": state["best"] if self.opts.keep == "best" else state["last"],
                "parameters": parameter_count(self.model), "seconds": seconds, "world_size": self.world,
                # without the held-out evaluations
                "train_seconds": seconds - totals["held_out"],
                "strategy": self.parallel.strategy if self.world > 1 else "single", "device": str(self.device),
                "frames_per_second": totals["frames"] * self.reader[1] / busy,
                "data_wait_fraction": totals["data"] / busy,
                **{f"mean_t_{key}": totals[key] / steps for key in ("data", "calc", "transmit", "merge", "wait")},
                "mean_bytes_per_step": totals["bytes"] / steps}


class _Window:
    """The training steps since metrics were last logged: loss and accuracy summed on the device, times on the host."""

    def __init__(self) -> None:
        self.steps = self.count = self.frames = 0
        self.seconds = self.data = self.started = 0.0
        self.loss: torch.Tensor | float = 0.0
        self.correct: torch.Tensor | None = None
        self.parts: dict[str, torch.Tensor] = {}
        self.times: dict[str, float] = {}

    def add(self, stats: Any, seconds: float, data: float, times: dict[str, float]) -> None:
        """One step's statistics, its wall time and the part of it spent waiting for data."""
        if not self.steps:
            self.started = time.perf_counter() - seconds
        self.steps += 1
        self.count += stats.count
        self.frames += stats.frames
        self.seconds += seconds
        self.data += data
        self.loss = self.loss + stats.loss_sum.double()
        if stats.correct is not None:
            self.correct = stats.correct if self.correct is None else self.correct + stats.correct
        for name, value in stats.parts.items():
            self.parts[name] = self.parts.get(name, 0.0) + value.double()
        for name, value in times.items():
            self.times[name] = self.times.get(name, 0.0) + value

    def metrics(self, world: int, lr: float) -> dict[str, float]:
        """Means over the window (throughput of all learners together). Its time runs from the first step's
        start until its sums are read, which waits for a GPU to finish them: the host runs ahead of the GPU
        between reads, so the steps' own times would leave part of the GPU's work out."""
        count = max(self.count, 1)
        loss = float(self.loss)
        seconds = max(time.perf_counter() - self.started, self.seconds, 1e-9)
        out = {"loss": loss / count, "lr": lr, "frames_per_second": self.frames * world / seconds,
               "data_wait_fraction": self.data / seconds, "step_seconds": seconds / self.steps}
        if self.correct is not None:
            out["frame_accuracy"] = float(self.correct) / count
        out.update({name: float(value) / count for name, value in self.parts.items()})
        out.update({name: value / self.steps for name, value in self.times.items()})
        return out


def _held_out(model: torch.nn.Module, part: FeatureDataset, opts: Training, objective: str,
              device: torch.device, world: int, criterion: Callable) -> tuple[float, float | None]:
    """Held-out loss and accuracy over all ranks' parts (identical on every rank)."""
    loss, accuracy = evaluate(model, part, opts.max_frames, objective, device, opts.amp, criterion)
    count = len(part) if objective == "ctc" else sum(part.lengths)
    totals = _average([loss * count, (accuracy or 0.0) * count, float(count)], device, world)
    loss = totals[0] / max(totals[2], 1)
    return loss, (totals[1] / max(totals[2], 1) if accuracy is not None else None)
