"""One trainer for every neural acoustic model (frame cross-entropy on tied-state targets).

Runs as one process or under ``torchrun`` (``torch.distributed``: gloo on CPU, NCCL on GPU,
DDP all-reduce). Checkpoints hold the full state — model, optimiser, scheduler, RNG, epoch
and position inside the epoch — are written atomically every ``checkpoint_every`` steps and
loaded with ``weights_only=True``; a run killed at any point and restarted ends with the
same model as an uninterrupted one.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn import functional as F

from asrflow.nnet.data import BucketBatchSampler, FeatureDataset, collate
from asrflow.nnet.models import build_model, parameter_count

CHECKPOINT = "checkpoint.pt"


@dataclass
class TrainOptions:
    """Optimisation settings (the ``nnet`` config section, without the model)."""

    epochs: int = 10
    max_frames: int = 20000
    lr: float = 1e-3
    warmup_steps: int = 100
    weight_decay: float = 1e-4
    clip: float = 5.0
    checkpoint_every: int = 50
    patience: int = 3
    seed: int = 0


class _Schedule:
    """Learning-rate factor: linear warm-up, then inverse square-root decay."""

    def __init__(self, warmup: int) -> None:
        self.warmup = max(warmup, 1)

    def __call__(self, step: int) -> float:
        step += 1
        return min(step / self.warmup, math.sqrt(self.warmup / step))


def _atomic_save(state: dict, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def _distributed() -> tuple[int, int]:
    if "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def evaluate(model: torch.nn.Module, dataset: FeatureDataset, max_frames: int) -> tuple[float, float]:
    """Held-out cross-entropy per frame and frame accuracy."""
    model.eval()
    loss = correct = frames = 0.0
    sampler = BucketBatchSampler(dataset.lengths, max_frames, seed=0)
    with torch.no_grad():
        for batch in torch.utils.data.DataLoader(dataset, batch_sampler=sampler, collate_fn=collate):
            logits, _ = model(batch["feats"], batch["lengths"])
            targets = batch["targets"]
            mask = targets != -100
            loss += float(F.cross_entropy(logits[mask], targets[mask], reduction="sum"))
            correct += float((logits[mask].argmax(-1) == targets[mask]).sum())
            frames += float(mask.sum())
    model.train()
    return loss / max(frames, 1), correct / max(frames, 1)


def train(model_config: dict[str, Any], opts: TrainOptions, train_set: FeatureDataset, valid_set: FeatureDataset,
          num_classes: int, out_dir: str | Path, log_metrics: Callable[[int, dict], None] = lambda s, m: None,
          log: Callable[[str], None] = print) -> dict[str, Any]:
    """Train (or resume) and write ``final.pt``; returns a summary."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rank, world = _distributed()
    torch.manual_seed(opts.seed)
    input_dim = train_set[0][1].shape[1]
    model = build_model(model_config, input_dim, num_classes)
    ddp = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model
    optimiser = torch.optim.AdamW(model.parameters(), lr=opts.lr, weight_decay=opts.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimiser, _Schedule(opts.warmup_steps))
    sampler = BucketBatchSampler(train_set.lengths, opts.max_frames, opts.seed, rank, world)
    state = {"epoch": 0, "batch": 0, "step": 0, "best": float("inf"), "bad_epochs": 0}
    ckpt = out / CHECKPOINT
    if ckpt.is_file():
        saved = torch.load(ckpt, weights_only=True)
        model.load_state_dict(saved["model"])
        optimiser.load_state_dict(saved["optimiser"])
        scheduler.load_state_dict(saved["scheduler"])
        torch.set_rng_state(saved["rng"])
        state = saved["state"]
        log(f"resumed from {ckpt}: epoch {state['epoch']}, batch {state['batch']}, step {state['step']}")

    def save() -> None:
        if rank == 0:
            _atomic_save({"model": model.state_dict(), "optimiser": optimiser.state_dict(),
                          "scheduler": scheduler.state_dict(), "rng": torch.get_rng_state(), "state": dict(state)},
                         ckpt)

    start = time.perf_counter()
    while state["epoch"] < opts.epochs and state["bad_epochs"] < opts.patience:
        sampler.set_epoch(state["epoch"])
        batches = sampler.epoch_batches()
        for index in range(state["batch"], len(batches)):
            t0 = time.perf_counter()
            batch = collate([train_set[i] for i in batches[index]])
            t1 = time.perf_counter()
            logits, _ = ddp(batch["feats"], batch["lengths"])
            targets = batch["targets"]
            mask = targets != -100
            loss = F.cross_entropy(logits[mask], targets[mask])
            optimiser.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), opts.clip)
            optimiser.step()
            scheduler.step()
            t2 = time.perf_counter()
            state["step"] += 1
            state["batch"] = index + 1
            frames = int(mask.sum())
            log_metrics(state["step"], {
                "loss": float(loss.detach()), "frame_accuracy": float((logits[mask].argmax(-1) == targets[mask]).float().mean()),
                "lr": scheduler.get_last_lr()[0], "frames_per_second": frames / (t2 - t0),
                "data_wait_fraction": (t1 - t0) / (t2 - t0)})
            if state["step"] % opts.checkpoint_every == 0:
                save()
        valid_loss, valid_acc = evaluate(model, valid_set, opts.max_frames)
        log(f"epoch {state['epoch']}: held-out loss {valid_loss:.4f}, frame accuracy {valid_acc:.4f}")
        log_metrics(state["step"], {"valid_loss": valid_loss, "valid_frame_accuracy": valid_acc})
        if valid_loss < state["best"] - 1e-4:
            state["best"], state["bad_epochs"] = valid_loss, 0
            if rank == 0:
                _atomic_save({"model": model.state_dict(), "config": dict(model_config),
                              "num_classes": num_classes, "input_dim": input_dim}, out / "best.pt")
        else:
            state["bad_epochs"] += 1
        state["epoch"] += 1
        state["batch"] = 0
        save()
    if rank == 0:
        best = torch.load(out / "best.pt", weights_only=True) if (out / "best.pt").is_file() else None
        final = best or {"model": model.state_dict(), "config": dict(model_config), "num_classes": num_classes,
                         "input_dim": input_dim}
        _atomic_save(final, out / "final.pt")
    return {"epochs": state["epoch"], "steps": state["step"], "best_valid_loss": state["best"],
            "parameters": parameter_count(model), "seconds": time.perf_counter() - start, "world_size": world}
