"""``asrflow bench nnet --bare``: the trainer against a bare PyTorch loop on the same model and batch shape.

The data is synthetic, so the benchmark needs no corpus: utterances of 300–1,200 frames of
40-dim features written as a feature dir (Kaldi ark/scp, per-speaker CMVN statistics), with
random frame targets over 3,000 classes (hybrid) or random unit sequences (CTC: 500 units, one
per 8 input frames). For each model preset:

- the **trainer** (:func:`asrflow.nnet.train.train` with the given options) trains on it; its
  frames/s and data wait are taken from the metrics of every epoch after the first (the first
  pays for warm-up, autotuning and compilation);
- the **bare loop** runs forward, backward and a fused AdamW step on one fixed batch already on
  the device, of the trainer's batch shape (``max_frames`` frames of the mean utterance length),
  under the same autocast; and once more over random batches of the trainer's own epoch shapes
  (its length buckets, padding included), already on the device (``bare_epoch_fps``): the
  trainer's overhead apart from what its shapes cost (recurrent layers step through the longest
  utterance, attention grows with the square of the length);
- the **data path** alone makes every batch of an epoch with the trainer's loader (reading,
  CMVN, padding, SpecAugment when on, pinning) and copies it to the device, without a model.

MFU is frames/s × model FLOPs per frame (forward + backward on a bare batch,
:func:`asrflow.nnet.bench.batch_flops`) over the device's measured dense matrix-product rate
(:func:`asrflow.nnet.bench.matmul_peak`).
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from asrflow.config.settings import Training
from asrflow.config.sizes import PRESETS
from asrflow.features import cmvn_stats, write_ark
from asrflow.nnet.bench import append_line, batch_flops, matmul_peak
from asrflow.nnet.data import BucketBatchSampler, FeatureDataset, loaded
from asrflow.nnet.models import build_model, parameter_count
from asrflow.nnet.objectives import OBJECTIVES
from asrflow.nnet.train import adamw

DIM, HYBRID_CLASSES, CTC_UNITS, FRAMES_PER_UNIT = 40, 3000, 500, 8
ROW_KEYS = ("preset", "parameters", "device", "trainer_fps", "bare_fps", "ratio", "epoch_ratio", "data_wait", "mfu",
            "bare_mfu", "data_fps")


def objective_of(preset: str) -> str:
    """CTC for presets that subsample (their outputs are fewer than the frames), hybrid otherwise."""
    return "ctc" if PRESETS[preset].get("subsampling", 1) > 1 else "hybrid"


def synthetic_corpus(root: Path, frames: int, objective: str, seed: int = 0, speakers: int = 20,
                     lengths: tuple[int, int] = (300, 1200)) -> dict[str, np.ndarray]:
    """Write ``root/data/train`` (utt2spk) and ``root/feats/train`` (feats, utt2num_frames, CMVN) of about
    ``frames`` frames; return the targets (frame classes, or unit sequences numbered from 1 for CTC)."""
    rng = np.random.default_rng(seed)
    (root / "data" / "train").mkdir(parents=True, exist_ok=True)
    (root / "feats" / "train").mkdir(parents=True, exist_ok=True)
    targets: dict[str, np.ndarray] = {}
    items: list[tuple[str, np.ndarray]] = []
    total = 0
    while total < frames:
        utt = f"spk{len(items) % speakers:03d}-utt{len(items):06d}"
        n = int(rng.integers(lengths[0], lengths[1] + 1))
        items.append((utt, rng.standard_normal((n, DIM), dtype=np.float32)))
        targets[utt] = (rng.integers(0, HYBRID_CLASSES, n) if objective == "hybrid"
                        else rng.integers(1, CTC_UNITS, max(1, n // FRAMES_PER_UNIT)))
        total += n
    feats = root / "feats" / "train"
    (feats / "feats.scp").write_text("\n".join(write_ark(feats / "feats.ark", items)) + "\n")
    (feats / "utt2num_frames").write_text("".join(f"{u} {m.shape[0]}\n" for u, m in items))
    (root / "data" / "train" / "utt2spk").write_text("".join(f"{u} {u.split('-')[0]}\n" for u, _ in items))
    stats: dict[str, np.ndarray] = {}
    for utt, matrix in items:
        speaker = utt.split("-")[0]
        stats[speaker] = stats.get(speaker, 0) + cmvn_stats(matrix)
    (feats / "cmvn.scp").write_text("\n".join(write_ark(feats / "cmvn.ark", sorted(stats.items()))) + "\n")
    return targets


def _synchronise(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bare_loop(model: torch.nn.Module, objective: str, batch: dict[str, Any], amp: bool, steps: int) -> float:
    """Frames per second of forward, backward and a fused AdamW step on one fixed batch."""
    return bare_epoch(model, objective, [batch] * steps, amp)


def epoch_batches(objective: str, lengths: list[list[int]], device: torch.device, seed: int = 0) -> list[dict]:
    """Random batches on ``device`` of the given utterance lengths (one list per batch), padded to the longest as
    the trainer's are, with random targets (padding -100 for hybrid)."""
    generator = torch.Generator().manual_seed(seed)
    out = []
    for batch in lengths:
        size, longest = len(batch), max(batch)
        lens = torch.tensor(batch)
        item: dict[str, Any] = {"feats": torch.randn(size, longest, DIM, generator=generator).to(device),
                                "lengths": lens}
        if objective == "hybrid":
            targets = torch.randint(0, HYBRID_CLASSES, (size, longest), generator=generator)
            targets[torch.arange(longest).unsqueeze(0) >= lens.unsqueeze(1)] = -100
            item["targets"], item["target_lengths"] = targets.to(device), lens.clone()
        else:
            units = torch.clamp(lens // FRAMES_PER_UNIT, min=1)
            targets = torch.randint(1, CTC_UNITS, (size, int(units.max())), generator=generator)
            targets[torch.arange(targets.shape[1]).unsqueeze(0) >= units.unsqueeze(1)] = -100
            item["targets"], item["target_lengths"] = targets.to(device), units
        out.append(item)
    return out


def bare_epoch(model: torch.nn.Module, objective: str, batches: list[dict], amp: bool) -> float:
    """Frames per second (real, not padding) of the bare step over batches of the trainer's shapes already on the
    device: what the trainer would reach without any overhead of its own, on the same padded shapes."""
    device = batches[0]["feats"].device
    optimiser = adamw(model.parameters(), device, lr=1e-4)
    loss_fn = OBJECTIVES[objective]
    model.train()

    def step(batch: dict) -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp and device.type == "cuda"):
            logits, out_lengths = model(batch["feats"], batch["lengths"])
        loss, _ = loss_fn(logits, out_lengths, batch)
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        optimiser.step()

    for batch in batches[:3]:  # warm-up
        step(batch)
    _synchronise(device)
    start = time.perf_counter()
    for batch in batches:
        step(batch)
    _synchronise(device)
    return sum(int(b["lengths"].sum()) for b in batches) / (time.perf_counter() - start)


def data_path_fps(dataset: FeatureDataset, opts: Training, objective: str, device: torch.device) -> dict[str, float]:
    """Frames/s of the trainer's loader alone over one epoch (batches made, pinned and copied to ``device``),
    and the padding it costs (padded frames over real frames − 1)."""
    from asrflow.nnet.train import _BatchMaker, _to

    sampler = BucketBatchSampler(dataset.lengths, opts.max_frames, opts.seed)
    batches = sampler.epoch_batches(0)
    cuda = device.type == "cuda"
    make = _BatchMaker(dataset, sampler, opts, objective, 0, pin=cuda and not opts.loader_workers)
    frames = 0
    start = time.perf_counter()
    for _, batch in loaded(make, [(0, i) for i in range(len(batches))], opts.loader_workers, opts.prefetch,
                           pin=cuda):
        batch = _to(batch, device)
        frames += int(batch["lengths"].sum())
    _synchronise(device)
    seconds = time.perf_counter() - start
    padded = sum(sampler.padded(b) for b in batches)
    return {"data_fps": frames / seconds, "padding": padded / max(frames, 1) - 1}


def trainer_fps(preset: str, objective: str, dataset: FeatureDataset, opts: Training) -> dict[str, Any]:
    """Train ``preset`` with the real trainer; frames/s and data wait over the epochs after the first."""
    from asrflow.nnet.train import train

    windows: list[tuple[int, dict[str, float]]] = []
    valid = dataset.part(0, max(1, len(dataset) // 16))  # a small held-out pass per epoch
    with tempfile.TemporaryDirectory(prefix="asrflow-bench-bare-") as tmp:
        summary = train({"preset": preset}, opts, dataset, valid,
                        HYBRID_CLASSES if objective == "hybrid" else CTC_UNITS, Path(tmp), objective=objective,
                        log=lambda message: None,
                        log_metrics=lambda step, m: windows.append((step, m)) if "step_seconds" in m else None)
    per_epoch = summary["steps"] // max(summary["epochs"], 1)
    ends = [step for step, _ in windows]
    counted = [(end - start, m, end) for start, (end, m) in zip([0] + ends, windows)]  # (steps, metrics, last step)
    later = [(n, m) for n, m, end in counted if end > per_epoch] or [(n, m) for n, m, _ in counted]
    seconds = sum(n * m["step_seconds"] for n, m in later)
    fps = sum(n * m["step_seconds"] * m["frames_per_second"] for n, m in later) / seconds
    wait = sum(n * m["step_seconds"] * m["data_wait_fraction"] for n, m in later) / seconds
    return {"trainer_fps": fps, "data_wait": wait, "trainer_steps": summary["steps"],
            "trainer_seconds": summary["train_seconds"], "device_name": summary["device"]}


def bench_preset(preset: str, root: Path, targets: dict[str, np.ndarray], opts: Training, peak: float,
                 bare_steps: int, log: Callable[[str], None]) -> dict[str, Any]:
    """One JSON row: the preset through the trainer, the bare loop and the data path, on the trainer's device."""
    objective = objective_of(preset)
    dataset = FeatureDataset(root / "data", root / "feats", "train", targets, frame_targets=objective == "hybrid",
                             subsampling=PRESETS[preset].get("subsampling", 1))
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    mean_length = int(np.mean(dataset.lengths))
    batch = epoch_batches(objective, [[mean_length] * max(1, opts.max_frames // mean_length)], device)[0]
    torch.manual_seed(opts.seed)
    model = build_model({"preset": preset}, DIM, HYBRID_CLASSES if objective == "hybrid" else CTC_UNITS).to(device)
    flops, frames = batch_flops(model, objective, batch, opts.amp)
    per_frame = flops / frames
    bare = bare_loop(model, objective, batch, opts.amp, bare_steps)
    log(f"{preset}: bare loop {bare:,.0f} frames/s")
    sampler = BucketBatchSampler(dataset.lengths, opts.max_frames, opts.seed)
    shapes = [[dataset.lengths[i] for i in b] for b in sampler.epoch_batches(1)]
    bare_shapes = bare_epoch(model, objective, epoch_batches(objective, shapes, device), opts.amp)
    log(f"{preset}: bare loop over the trainer's batch shapes {bare_shapes:,.0f} frames/s")
    del model
    data = data_path_fps(dataset, opts, objective, device)
    log(f"{preset}: data path {data['data_fps']:,.0f} frames/s")
    trainer = trainer_fps(preset, objective, dataset, opts)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({torch.get_num_threads()} threads)"
    return {"preset": preset, "objective": objective,
            "parameters": parameter_count(build_model({"preset": preset}, DIM, HYBRID_CLASSES
                                                      if objective == "hybrid" else CTC_UNITS)),
            "device": name, "torch": torch.__version__, "amp": bool(opts.amp and device.type == "cuda"),
            "compile": opts.compile, "loader_workers": opts.loader_workers, "max_frames": opts.max_frames,
            "utterances": len(dataset), "frames": sum(dataset.lengths), "epochs": opts.epochs,
            "trainer_fps": trainer["trainer_fps"], "bare_fps": bare, "ratio": trainer["trainer_fps"] / bare,
            "bare_epoch_fps": bare_shapes, "epoch_ratio": trainer["trainer_fps"] / bare_shapes,
            "data_wait": trainer["data_wait"], "data_fps": data["data_fps"], "padding": data["padding"],
            "gflops_per_frame": per_frame / 1e9, "peak_tflops": peak,
            "mfu": trainer["trainer_fps"] * per_frame / (peak * 1e12), "bare_mfu": bare * per_frame / (peak * 1e12),
            "trainer_steps": trainer["trainer_steps"], "trainer_seconds": trainer["trainer_seconds"]}


def run_bare(presets: list[str], frames: int, opts: Training, bare_steps: int = 20, out: str | Path | None = None,
             log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """A row per preset (appended as JSON lines to ``out`` when given), on synthetic data of ``frames`` frames."""
    unknown = [p for p in presets if p not in PRESETS]
    if unknown:
        raise ValueError(f"unknown preset(s) {', '.join(unknown)}; known: {', '.join(PRESETS)}")
    peak = matmul_peak(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    log(f"measured matrix-product peak: {peak:.2f} TFLOP/s")
    rows = []
    with tempfile.TemporaryDirectory(prefix="asrflow-bench-data-") as tmp:
        corpora: dict[str, tuple[Path, dict[str, np.ndarray]]] = {}
        for preset in presets:
            objective = objective_of(preset)
            if objective not in corpora:
                root = Path(tmp) / objective
                corpora[objective] = (root, synthetic_corpus(root, frames, objective, seed=opts.seed))
            row = bench_preset(preset, *corpora[objective], opts, peak, bare_steps, log)
            log(json.dumps({k: row[k] for k in ROW_KEYS}))
            rows.append(row)
            append_line(out, row)
    return rows


def run_data_path(frames: int, opts: Training, out: str | Path | None = None,
                  log: Callable[[str], None] = print) -> dict[str, Any]:
    """The data path alone on synthetic hybrid data of ``frames`` frames, with and without SpecAugment: a JSON
    row each (appended to ``out`` when given)."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    rows = []
    with tempfile.TemporaryDirectory(prefix="asrflow-bench-data-") as tmp:
        targets = synthetic_corpus(Path(tmp), frames, "hybrid", seed=opts.seed)
        dataset = FeatureDataset(Path(tmp) / "data", Path(tmp) / "feats", "train", targets)
        masks = {"freq_masks": 2, "time_masks": 2}
        for augment in (False, True):
            run = opts.replace(specaugment=opts.specaugment.replace(**(masks if augment else
                                                                       {"freq_masks": 0, "time_masks": 0})))
            row = {"stage": "data_path", "device": str(device), "cpu_threads": torch.get_num_threads(),
                   "loader_workers": opts.loader_workers, "max_frames": opts.max_frames, "frames": sum(dataset.lengths),
                   "specaugment": augment, **data_path_fps(dataset, run, "hybrid", device)}
            log(json.dumps(row))
            rows.append(row)
            append_line(out, row)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    """A Markdown table of bare-loop rows."""
    lines = ["| preset | parameters | device | trainer frames/s | bare frames/s | trainer / bare "
             "| trainer / bare on its shapes | data wait | MFU trainer / bare | data path frames/s | padding |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['preset']} | {r['parameters'] / 1e6:.1f} M | {r['device']} | {r['trainer_fps']:,.0f} "
                     f"| {r['bare_fps']:,.0f} | {r['ratio']:.2f} | {r['epoch_ratio']:.2f} "
                     f"| {100 * r['data_wait']:.1f} % "
                     f"| {100 * r['mfu']:.1f} % / {100 * r['bare_mfu']:.1f} % | {r['data_fps']:,.0f} "
                     f"| {100 * r['padding']:.1f} % |")
    return "\n".join(lines)


def default_steps(frames: int, max_frames: int) -> int:
    """Bare-loop steps: as many batches as one epoch of the synthetic data, at least 5."""
    return max(5, math.ceil(frames / max_frames))
