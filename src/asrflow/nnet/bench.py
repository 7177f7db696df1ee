"""``asrflow bench nnet``: training throughput of each network, its FLOPs and the share of the device's peak.

Every network of ``nnet.models`` named is trained by the real trainer (:func:`asrflow.nnet.train.train`,
one process, the configured options) on its real training data for a few epochs; the
throughput is the trainer's own (input frames per second of data + compute time, and of
compute alone). Model FLOPs per training frame (forward + backward) are counted by torch's
``FlopCounterMode`` on the first batches of the training set, so the achieved FLOP rate is
``frames/s × FLOPs/frame``. It is set against two peaks: the device's measured dense matrix
product rate (bfloat16 on a GPU, as the trainer's autocast runs; float32 on a CPU, with the
threads torch uses) and, for known GPUs, the datasheet's dense bfloat16 figure.
"""

from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

# Dense (no sparsity) bfloat16 tensor-core peaks from the vendors' datasheets, TFLOP/s.
DATASHEET_BF16_TFLOPS = {"H100 PCIe": 756.0, "H100": 989.4, "H200": 989.4, "A100": 312.0, "L40S": 362.0}

ROW_KEYS = ("system", "device", "max_frames", "frames_per_second", "compute_frames_per_second",
            "data_wait_fraction", "gflops_per_frame", "achieved_tflops", "percent_of_measured_peak",
            "percent_of_datasheet_peak")


def datasheet_peak(device_name: str) -> float | None:
    """The datasheet's dense bfloat16 TFLOP/s of a GPU named ``device_name`` (None if unknown)."""
    for key in sorted(DATASHEET_BF16_TFLOPS, key=len, reverse=True):  # "H100 PCIe" before "H100"
        if key in device_name:
            return DATASHEET_BF16_TFLOPS[key]
    return None


def matmul_peak(device: torch.device, size: int | None = None, repeats: int = 10) -> float:
    """Measured dense matrix-product rate in TFLOP/s: bfloat16 on CUDA, float32 on CPU."""
    cuda = device.type == "cuda"
    size = size or (8192 if cuda else 2048)
    dtype = torch.bfloat16 if cuda else torch.float32
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    if cuda:
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(repeats):
        a @ b
    if cuda:
        torch.cuda.synchronize(device)
    return 2 * size ** 3 * repeats / (time.perf_counter() - start) / 1e12


def recurrent_flops_per_frame(model: torch.nn.Module) -> float:
    """Forward + backward FLOPs per input frame of the model's LSTM layers (which torch's counter leaves out):
    per layer and direction, 4 gates of (input + recurrent) × cells multiply-adds, and the projection."""
    flops = 0.0
    for lstm in (m for m in model.modules() if isinstance(m, torch.nn.LSTM)):
        directions = 2 if lstm.bidirectional else 1
        out = lstm.proj_size or lstm.hidden_size
        for layer in range(lstm.num_layers):
            inputs = lstm.input_size if layer == 0 else out * directions
            per = 2 * 4 * lstm.hidden_size * (inputs + out) + (2 * lstm.hidden_size * out if lstm.proj_size else 0)
            flops += directions * per
    return 3 * flops


def batch_flops(model: torch.nn.Module, objective: str, batch: dict[str, Any], amp: bool = False) -> tuple[float, int]:
    """Forward + backward FLOPs of ``model`` on one batch (torch's ``FlopCounterMode``, LSTM layers by
    :func:`recurrent_flops_per_frame`), and the frames the trainer credits for it (padding paid, not credited)."""
    from torch.utils.flop_counter import FlopCounterMode

    from asrflow.nnet.objectives import OBJECTIVES

    device = batch["feats"].device
    with FlopCounterMode(display=False) as counter:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp and device.type == "cuda"):
            logits, out_lengths = model(batch["feats"], batch["lengths"])
        loss, stats = OBJECTIVES[objective](logits, out_lengths, batch)
        loss.backward()
    model.zero_grad(set_to_none=True)
    real = int(batch["lengths"].sum())  # packed sequences: an LSTM steps through real frames only
    return counter.get_total_flops() + recurrent_flops_per_frame(model) * real, stats.frames


def flops_per_frame(model_config: dict[str, Any], input_dim: int, num_classes: int, objective: str,
                    dataset: Any, max_frames: int, batches: int = 4) -> float:
    """Forward + backward FLOPs per training frame, counted on the first ``batches`` batches (CPU, float32)."""
    from asrflow.nnet.data import BucketBatchSampler, collate
    from asrflow.nnet.models import build_model

    model = build_model(model_config, input_dim, num_classes)
    sampler = BucketBatchSampler(dataset.lengths, max_frames, seed=0)
    flops = frames = 0
    for indices in sampler.epoch_batches()[:batches]:
        counted, credited = batch_flops(model, objective, collate([dataset[i] for i in indices]))
        flops += counted
        frames += credited
    return flops / max(frames, 1)


def bench_network(config: dict[str, Any], system: str, paths: dict[str, Any], epochs: int,
                  max_frames: int | None = None, peak: float | None = None) -> dict[str, Any]:
    """Train ``system`` for ``epochs`` epochs on the trainer's device and return its throughput row.

    ``peak`` is the device's measured matrix-product TFLOP/s (:func:`matmul_peak`, measured here when None).
    """
    from asrflow.config.paths import Paths
    from asrflow.nnet.stage import train_options, training_data
    from asrflow.nnet.train import train

    model = config["nnet"]["models"][system]
    bundle = Paths(data=paths["data"], features=paths["features"], out=Path("."), gmm=paths.get("gmm"),
                   lang=paths.get("lang"))
    targets, train_set, valid_set, _ = training_data(config, system, paths["train"], bundle)
    opts = train_options(config, system, epochs)
    if max_frames:
        opts = opts.replace(max_frames=max_frames)
    with tempfile.TemporaryDirectory(prefix="asrflow-bench-nnet-") as tmp:
        summary = train(model, opts, train_set, valid_set, targets.num_classes, Path(tmp), log=lambda m: None,
                        objective=model["objective"], extra=targets.extra, state_dir=Path(tmp) / "state")
    device = torch.device(summary["device"])
    input_dim = train_set[0][1].shape[1]
    per_frame = flops_per_frame(model, input_dim, targets.num_classes, model["objective"], train_set, opts.max_frames)
    fps = summary["frames_per_second"]
    compute_fps = fps / max(1.0 - summary["data_wait_fraction"], 1e-9)
    achieved = per_frame * fps / 1e12
    measured = peak or matmul_peak(device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({torch.get_num_threads()} threads)"
    sheet = datasheet_peak(name) if device.type == "cuda" else None
    return {"system": system, "type": model["type"], "objective": model["objective"], "device": name,
            "torch": torch.__version__, "amp": bool(opts.amp and device.type == "cuda"),
            "parameters": summary["parameters"], "max_frames": opts.max_frames, "epochs": summary["epochs"],
            "steps": summary["steps"], "train_seconds": summary["train_seconds"],
            "frames_per_second": fps, "compute_frames_per_second": compute_fps,
            "data_wait_fraction": summary["data_wait_fraction"], "gflops_per_frame": per_frame / 1e9,
            "achieved_tflops": achieved, "measured_peak_tflops": measured,
            "percent_of_measured_peak": 100 * achieved / measured,
            "datasheet_peak_tflops": sheet, "percent_of_datasheet_peak": 100 * achieved / sheet if sheet else None}


def append_line(out: str | Path | None, row: dict[str, Any]) -> None:
    """Append ``row`` as a JSON line to ``out`` (its folder made), when ``out`` is given."""
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        with open(out, "a") as f:
            f.write(json.dumps(row) + "\n")


def table(rows: list[dict[str, Any]]) -> str:
    """A Markdown table of bench rows."""
    lines = ["| network | device | max_frames | frames/s | compute-only frames/s | data wait | GFLOP/frame "
             "| achieved TFLOP/s | % of measured peak | % of datasheet peak |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        sheet = f"{r['percent_of_datasheet_peak']:.3f}" if r["percent_of_datasheet_peak"] is not None else "–"
        lines.append(f"| {r['system']} | {r['device']} | {r['max_frames']} | {r['frames_per_second']:.0f} "
                     f"| {r['compute_frames_per_second']:.0f} | {r['data_wait_fraction']:.3f} "
                     f"| {r['gflops_per_frame']:.4f} | {r['achieved_tflops']:.4f} "
                     f"| {r['percent_of_measured_peak']:.3f} | {sheet} |")
    return "\n".join(lines)


def run_benchmark(config: dict[str, Any], systems: list[str], paths: dict[str, Any], epochs: int,
                  max_frames: list[int | None], out: str | Path | None = None,
                  log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """One row per (system, batch size); appended as JSON lines to ``out`` when given."""
    unknown = [s for s in systems if s not in config["nnet"]["models"]]
    if unknown:
        raise ValueError(f"unknown network(s) {', '.join(unknown)}; nnet.models has "
                         f"{', '.join(config['nnet']['models'])}")
    peak = matmul_peak(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    log(f"measured matrix-product peak: {peak:.2f} TFLOP/s")
    rows = []
    for system in systems:
        for frames in max_frames:
            row = bench_network(config, system, paths, epochs, frames, peak)
            log(json.dumps({k: row[k] for k in ROW_KEYS}))
            rows.append(row)
            append_line(out, row)
    return rows
