"""``asrflow bench parallel``: real speedup of each strategy on this machine, beside the timing model.

Every strategy trains the same network on the same data with 1 and more learner processes
under ``torchrun`` on loopback gloo; the single-learner run is the baseline. The speedup is
the ratio of training throughput (frames per second of all learners together) over the steps
after the first ``warmup`` of each run (start-up, allocation and the first exchanges left
out; held-out evaluations never count), printed beside the timing model's prediction from
the times the learners measured after their warm-up (:mod:`asrflow.parallel.timing`).

The data is a training split of a corpus (whole epochs of it) or, with ``steps``, a synthetic
split (:func:`asrflow.nnet.bare.synthetic_corpus`) of utterances of one length that gives every
learner exactly ``warmup + steps`` equal minibatches: a fixed amount of work, whatever the
learner count, so that ``T_calc`` dominates and runs can be compared from day to day. Each
learner may be pinned to a core of its own. Every setting is measured in ``repeats`` pairs (a
single-learner run and the parallel run); a row carries their median, min–max and interquartile
range, and says when the spread is wider than the gap to the prediction it would claim. Run as
a module it is the learner program that ``torchrun`` starts.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from asrflow.parallel.timing import StepTimes, pipeline_speedup, predict_speedup

ROW_KEYS = ("strategy", "learners", "compression", "batch", "measured_speedup", "speedup_min", "speedup_max",
            "speedup_iqr", "pairs", "predicted_speedup", "gap_to_predicted", "spread_exceeds_gap",
            "split_efficiency", "predicted_split", "t_calc", "t_transmit", "t_merge", "bytes_per_step",
            "timed_steps", "warmup_steps", "threads", "pinned")


def free_port() -> int:
    """A TCP port free on the loopback address now (a torchrun rendezvous on 127.0.0.1)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_learners(config_files: list[str], system: str, paths: dict[str, str], parallel: dict[str, Any],
                 epochs: int, threads: int, timeout: float = 3600, trace: str | Path | None = None,
                 warmup: int = 0, pin_from: int | None = None) -> list[dict[str, Any]]:
    """Train ``system`` with ``parallel['learners']`` processes; every learner's training summary.

    ``paths`` names the corpus split (``train``, ``data``, ``features``, ``gmm``) or a synthetic
    one (``synthetic``: a folder of :func:`synthetic_split`). Each summary has ``timed``: the
    steps after the first ``warmup``, their seconds, frames and mean step times. With ``pin_from``
    learner ``r`` runs on core ``pin_from + r`` (modulo the cores this process may use). With ``trace``
    every learner writes its per-step metrics (the step's times, loss, learning rate, seconds
    since training began) to ``<trace>.rank<r>.jsonl``.
    """
    with tempfile.TemporaryDirectory(prefix="asrflow-bench-") as tmp:
        summary = Path(tmp) / "summary.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(parallel["learners"]),
               "--master-addr", "127.0.0.1", "--master-port", str(free_port()), "-m", "asrflow.parallel.bench",
               "--config", *config_files, "--system", system, "--parallel", json.dumps(parallel),
               "--epochs", str(epochs), "--threads", str(threads), "--summary", str(summary), "--state", tmp,
               "--warmup", str(warmup), *(["--pin-from", str(pin_from)] if pin_from is not None else []),
               *[f"--{k}={v}" for k, v in paths.items() if v], *(["--trace", str(trace)] if trace else [])]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "OMP_NUM_THREADS": str(threads)})
        if proc.returncode != 0:
            tail = (proc.stdout + proc.stderr)[-3000:]
            raise RuntimeError(f"bench run {parallel} failed (exit {proc.returncode}):\n{tail}")
        return [json.loads(path.read_text()) for path in sorted(Path(tmp).glob("summary.json.*"))]


def _mean(summaries: list[dict[str, Any]], key: str) -> float:
    """``key``'s mean over the learners: from their timed steps (after the warm-up) when those have it."""
    timed = [s.get("timed", {}) for s in summaries]
    if all(key in t for t in timed):
        return sum(t[key] for t in timed) / len(timed)
    return sum(s[key] for s in summaries) / len(summaries)


def throughput(summaries: list[dict[str, Any]]) -> float:
    """Frames per second of a run's learners together over their timed steps: every learner's frames over the
    slowest learner's time (the job waits for it; a pipeline's stages share their batches: one learner's frames);
    without timed steps, the frames of the run over its time."""
    if all(s.get("timed", {}).get("seconds") for s in summaries):
        readers = summaries[:1] if summaries[0].get("strategy") == "pipeline" else summaries
        return sum(s["timed"]["frames"] for s in readers) / max(s["timed"]["seconds"] for s in summaries)
    return 1.0 / max(s["train_seconds"] for s in summaries)  # the same data in every run: inverse time


def spread(speedups: list[float], predicted: float) -> dict[str, Any]:
    """The pairs' median (the lower middle one for an even count: never flattering), min–max and interquartile
    range, the gap of the median to ``predicted``, and whether the spread is wider than that gap or than the
    median's gain over one learner (then the run cannot tell them apart)."""
    import numpy as np

    ordered = sorted(speedups)
    median = ordered[(len(ordered) - 1) // 2]
    low, high = ordered[0], ordered[-1]
    q1, q3 = (float(np.percentile(ordered, q)) for q in (25, 75))
    return {"measured_speedup": median, "measured_speedups": [round(x, 3) for x in ordered],
            "speedup_min": low, "speedup_max": high, "speedup_iqr": [q1, q3], "pairs": len(ordered),
            "gap_to_predicted": median / predicted - 1,
            "spread_exceeds_gap": high - low > abs(median - predicted),
            "spread_exceeds_gain": high - low > median - 1}


def split_efficiency(baseline: dict[str, Any], summaries: list[dict[str, Any]]) -> float:
    """How well one learner's work splits: the single learner's local work for the data over ``n`` times a learner's.

    Local work is reading + forward/backward + applying the update (``t_data + t_calc +
    t_merge``) times the steps taken (per frame of the timed steps, when the runs have them).
    The timing model assumes the ``n`` learners' local work adds up to the single learner's
    (1.0); with ``batch: global`` each learner step reads ``1/n`` of a minibatch, and the
    per-step costs that do not shrink with the batch (the optimiser, Python, small kernels)
    make it less.
    """
    if all(s.get("timed", {}).get("frames") for s in [baseline, *summaries]):  # per frame of the timed steps
        return (baseline["timed"]["work"] / baseline["timed"]["frames"]) / (
            sum(s["timed"]["work"] for s in summaries) / sum(s["timed"]["frames"] for s in summaries))

    def work(s: dict[str, Any]) -> float:
        return (s["mean_t_data"] + s["mean_t_calc"] + s["mean_t_merge"]) * s["steps"]

    return work(baseline) / sum(work(s) for s in summaries)


def stage_shares(config_files: list[str], system: str, stages: int) -> list[float]:
    """The parts of a step each stage of a ``stages``-stage pipeline takes, by the multiply-adds of its layers
    (the synthetic split's input and classes)."""
    from asrflow.config import load_config
    from asrflow.nnet.bare import DIM, HYBRID_CLASSES
    from asrflow.nnet.models import build_model
    from asrflow.parallel.pipeline import balance, layer_units, unit_costs

    config = load_config(*config_files)
    costs = unit_costs(layer_units(build_model(config["nnet"]["models"][system], DIM, HYBRID_CLASSES)))
    bounds = balance(costs, stages)
    return [sum(costs[a:b]) / sum(costs) for a, b in zip(bounds, bounds[1:])]


def bench_row(strategy: str, summaries: list[dict[str, Any]], baseline: dict[str, Any],
              parallel: dict[str, Any], shares: list[float] | None = None) -> dict:
    """One JSON line: measured and predicted speedup with the step times (means over learners) behind it.

    The job takes as long as its slowest learner; bytes are the mean a learner sends per step.
    ``predicted_speedup`` is the timing model on the learners' step times (a pipeline's: its stages'
    ``shares`` of a step, :func:`~asrflow.parallel.timing.pipeline_speedup`); ``predicted_split``
    also counts the measured :func:`split_efficiency` of the work itself.
    """
    times = StepTimes(calc=_mean(summaries, "mean_t_calc") + _mean(summaries, "mean_t_data"),
                      transmit=_mean(summaries, "mean_t_transmit"), merge=_mean(summaries, "mean_t_merge"),
                      wait=_mean(summaries, "mean_t_wait"))
    summary, learners = summaries[0], len(summaries)
    seconds = max(s["train_seconds"] for s in summaries)
    if strategy == "pipeline":  # steady state (the timed steps leave the fill and the epoch's drain out)
        predicted, efficiency = pipeline_speedup(shares or [1.0]), 1.0
    else:
        predicted, efficiency = predict_speedup(strategy, learners, times), split_efficiency(baseline, summaries)
    timed = summary.get("timed", {})
    return {"strategy": strategy, "learners": learners, "compression": parallel.get("compression", "none"),
            "k": parallel.get("k", 4), "overlap": bool(parallel.get("overlap", False)),
            "group_size": parallel.get("group_size", 2),
            "batch": parallel.get("batch", "global"),
            "measured_speedup": throughput(summaries) / throughput([baseline]),
            "predicted_speedup": predicted, "split_efficiency": efficiency, "predicted_split": predicted * efficiency,
            "t_calc": times.calc, "t_transmit": times.transmit, "t_merge": times.merge, "t_wait": times.wait,
            "bytes_per_step": _mean(summaries, "mean_bytes_per_step"), "train_seconds": seconds,
            "valid_frame_accuracy": summary.get("best_valid_frame_accuracy"),
            "baseline_t_calc": baseline["mean_t_calc"] + baseline["mean_t_data"],
            **({"stage_shares": shares, "predicted_from_stages": (
                baseline["mean_t_calc"] + baseline["mean_t_data"] + baseline["mean_t_merge"])
                / max(s["mean_t_calc"] + s["mean_t_data"] + s["mean_t_merge"] for s in summaries)}
               if strategy == "pipeline" else {}),
            "timed_steps": timed.get("steps"), "warmup_steps": timed.get("warmup"), "pinned": summary.get("pinned"),
            "threads": summary.get("threads")}


def bench_parallel(config_files: list[str], system: str, paths: dict[str, str], variants: list[dict[str, Any]],
                   learners: list[int], epochs: int, threads: int = 1, repeats: int = 1,
                   log: Callable[[str], None] = print, trace_dir: str | Path | None = None,
                   pairing: str = "before", warmup: int = 0, pin: bool = False, steps: int | None = None,
                   length: int = 400) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The single-learner baseline summary and one row per (variant, learner count > 1).

    The machine may be shared and its speed drift over minutes, so every parallel run is
    paired with a single-learner run, and the speedup is the median over ``repeats`` pairs
    of their throughput ratio (:func:`spread`); the step times are those of the median pair.
    ``pairing`` says when the pair's single learner runs: ``before`` the parallel run, or
    ``concurrent`` with it, on other cores, so both see the same drift of the machine (only
    where cores are spare: a learner per core and one more). Each run's first ``warmup``
    steps are not timed; with ``pin`` each learner runs on a core of its own (the concurrent
    single learner on the next one). With ``steps`` every run trains one epoch of a
    synthetic split that gives each learner ``warmup + steps`` minibatches of
    ``length``-frame utterances (``paths`` unused); else ``epochs`` of the corpus split in
    ``paths``. With ``trace_dir`` every run's learners write their per-step times there
    (``<run>.rank<r>.jsonl``, runs numbered in order).
    """
    if pairing not in ("before", "concurrent"):
        raise ValueError(f"pairing must be before or concurrent, not {pairing!r}")
    runs = iter(range(10 ** 6))
    splits: dict[tuple[int, str], dict[str, str]] = {}

    def trace(name: str) -> Path | None:
        return Path(trace_dir) / f"{next(runs):03d}-{name}" if trace_dir else None

    def data(n: int, batch: str) -> dict[str, str]:
        """The corpus split, or the synthetic one that gives ``n`` learners ``warmup + steps`` steps each."""
        if not steps:
            return paths
        if (n, batch) not in splits:
            from asrflow.config import load_config, settings

            config = load_config(*config_files)
            frames = synthetic_frames(steps, warmup, n, settings.training(config, system).max_frames, length, batch)
            root = synthetic_split(Path(workdir) / f"{n}-{batch}", frames, length,
                                   config["nnet"]["models"][system]["objective"])
            splits[(n, batch)] = {"synthetic": str(root)}
        return splits[(n, batch)]

    def readers(parallel: dict[str, Any]) -> int:  # a pipeline's stages all read the same batches
        return 1 if parallel.get("strategy") == "pipeline" else parallel["learners"]

    def run(parallel: dict[str, Any], name: str, pin_from: int) -> list[dict[str, Any]]:
        batch = "learner" if parallel.get("strategy") == "pipeline" else parallel.get("batch", "global")
        return run_learners(config_files, system, data(readers(parallel), batch),
                            parallel, 1 if steps else epochs, threads, trace=trace(name), warmup=warmup,
                            pin_from=pin_from if pin else None)

    def single(pin_from: int = 0) -> dict[str, Any]:
        return run({"strategy": "allreduce", "learners": 1}, "single", pin_from)[0]

    def pair(parallel: dict[str, Any], fresh_baseline: bool) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        name = "-".join(str(parallel[k]) for k in ("strategy", "learners", "compression", "k") if k in parallel) + (
            "-overlap" if parallel.get("overlap") else "")
        if pairing == "concurrent":
            with ThreadPoolExecutor(2) as pool:
                baseline = pool.submit(single, parallel["learners"])
                summaries = pool.submit(run, parallel, name, 0)
                return baseline.result(), summaries.result()
        baseline = single() if fresh_baseline else first
        return baseline, run(parallel, name, 0)

    with tempfile.TemporaryDirectory(prefix="asrflow-bench-split-") as workdir:
        if trace_dir:
            Path(trace_dir).mkdir(parents=True, exist_ok=True)
        first = single()
        log(f"1 learner: {first['train_seconds']:.1f} s, {first.get('timed', {}).get('steps')} timed steps, "
            f"held-out frame accuracy {first.get('best_valid_frame_accuracy')}")
        rows = []
        for variant in variants:
            for n in [variant["learners"]] if "learners" in variant else learners:
                if n == 1:
                    continue
                parallel = {**variant, "learners": n}
                pairs = []
                for repeat in range(repeats):
                    baseline, summaries = pair(parallel, fresh_baseline=bool(rows) or repeat > 0)
                    shares = stage_shares(config_files, system, n) if variant["strategy"] == "pipeline" else None
                    pairs.append(bench_row(variant["strategy"], summaries, baseline, parallel, shares))
                    log(f"  pair {repeat + 1} ({pairing}): 1 learner {baseline['train_seconds']:.2f} s, {n} learners "
                        f"{pairs[-1]['train_seconds']:.2f} s: {pairs[-1]['measured_speedup']:.3f}x")
                pairs.sort(key=lambda r: r["measured_speedup"])
                middle = pairs[(len(pairs) - 1) // 2]  # the median pair's step times
                row = {**middle, "pairing": pairing, "steps": steps,
                       **spread([r["measured_speedup"] for r in pairs], middle["predicted_speedup"])}
                log(json.dumps({k: row[k] for k in (*ROW_KEYS, "measured_speedups")}))
                rows.append(row)
        return first, rows


def table(rows: list[dict[str, Any]]) -> str:
    """Human-readable table of bench rows: the median speedup with the pairs' min–max, and a note on each row
    whose spread is wider than its gap to the prediction (or than its gain over one learner)."""
    lines = [f"{'strategy':<13}{'compr':>6}{'n':>3}{'measured':>10}{'min-max':>12}{'predicted':>10}{'gap':>8}"
             f"{'split eff':>10}{'pred×eff':>9}{'T_calc ms':>10}"
             f"{'T_trans ms':>11}{'T_merge ms':>11}{'T_wait ms':>10}{'bytes/step':>12}{'frame acc':>10}"]
    notes = []
    for r in rows:
        acc = r.get("valid_frame_accuracy")
        efficiency = r.get("split_efficiency", float("nan"))
        label = r["strategy"] + ("+overlap" if r.get("overlap") else "")
        low, high = r.get("speedup_min", r["measured_speedup"]), r.get("speedup_max", r["measured_speedup"])
        gap = r["measured_speedup"] / r["predicted_speedup"] - 1
        lines.append(f"{label:<13}{r['compression']:>6}{r['learners']:>3}{r['measured_speedup']:>10.2f}"
                     f"{f'{low:.2f}-{high:.2f}':>12}{r['predicted_speedup']:>10.2f}{100 * gap:>7.1f}%"
                     f"{efficiency:>10.2f}{r['predicted_speedup'] * efficiency:>9.2f}"
                     f"{r['t_calc'] * 1e3:>10.1f}{r['t_transmit'] * 1e3:>11.2f}"
                     f"{r['t_merge'] * 1e3:>11.2f}{r['t_wait'] * 1e3:>10.2f}{r['bytes_per_step']:>12.0f}"
                     f"{(acc if acc is not None else float('nan')):>10.4f}")
        if r.get("spread_exceeds_gain"):
            notes.append(f"{label} ({r['learners']}): the pairs' spread ({low:.2f}-{high:.2f}) is wider than the "
                         f"gain over one learner: no speedup is shown")
        elif r.get("spread_exceeds_gap"):
            notes.append(f"{label} ({r['learners']}): the pairs' spread ({low:.2f}-{high:.2f}) is wider than the gap "
                         f"to the prediction ({100 * gap:+.1f} %): the run cannot tell them apart")
    return "\n".join(lines + notes)


class StepClock:
    """The learner's training steps after the first ``warmup``, from its per-step metric windows (``log_every``
    1): their count, seconds, frames and local work (reading, computing, applying: not exchanging or waiting),
    and the mean step times of the timing model (``t_*``, which only a learner among several has)."""

    def __init__(self, warmup: int, world: int) -> None:
        self.warmup, self.world = warmup, world
        self.steps, self.seconds, self.frames, self.work = 0, 0.0, 0.0, 0.0
        self.times: dict[str, float] = {}

    def add(self, step: int, metrics: dict[str, Any]) -> None:
        """One window's metrics (one step with ``log_every`` 1); held-out evaluations and warm-up are skipped."""
        if "step_seconds" not in metrics or step <= self.warmup:
            return
        seconds = metrics["step_seconds"]
        self.steps += 1
        self.seconds += seconds
        self.frames += metrics["frames_per_second"] * seconds / self.world
        parts = {k: v for k, v in metrics.items() if k.startswith("t_") or k == "bytes_per_step"}
        self.work += (parts.get("t_data", 0.0) + parts.get("t_calc", 0.0) + parts.get("t_merge", 0.0)
                      if parts else seconds)  # one learner exchanges nothing: its whole step is local work
        for key, value in parts.items():
            self.times[key] = self.times.get(key, 0.0) + value

    def summary(self) -> dict[str, Any]:
        """The timed steps: ``steps``, ``seconds``, ``frames``, ``work``, ``warmup`` and mean ``mean_t_*``."""
        steps = max(self.steps, 1)
        means = {f"mean_{key}": value / steps for key, value in self.times.items()}
        return {"steps": self.steps, "seconds": self.seconds, "frames": self.frames, "work": self.work,
                "warmup": self.warmup, **means}


def pin_learner(index: int) -> int:
    """Pin this process (and the threads it starts later) to the ``index``-th of the cores it may use (modulo
    their count); returns the core."""
    cores = sorted(os.sched_getaffinity(0))
    core = cores[index % len(cores)]
    os.sched_setaffinity(0, {core})
    return core


def synthetic_split(root: Path, frames: int, length: int, objective: str, seed: int = 0) -> Path:
    """A synthetic training split of about ``frames`` frames in utterances of ``length`` frames under ``root``
    (:func:`asrflow.nnet.bare.synthetic_corpus`), with its targets in ``targets.npz``; returns ``root``."""
    import numpy as np

    from asrflow.nnet.bare import synthetic_corpus

    targets = synthetic_corpus(root, frames, objective, seed=seed, lengths=(length, length))
    np.savez(root / "targets.npz", **targets)
    return root


def synthetic_frames(steps: int, warmup: int, learners: int, max_frames: int, length: int, batch: str) -> int:
    """Frames of a synthetic split that gives each of ``learners`` exactly ``warmup + steps`` minibatches of whole
    ``length``-frame utterances (``max_frames`` per learner with ``batch: learner``, split over them with
    ``global``)."""
    per_learner = max_frames if batch == "learner" or learners == 1 else max(1, max_frames // learners)
    utterances = max(1, per_learner // length)
    return (warmup + steps) * learners * utterances * length


def _synthetic_data(root: Path, config: dict[str, Any], system: str, world: int) -> tuple[Any, Any, int, str]:
    """Training and held-out sets of a :func:`synthetic_split` (the held-out one: a few of its utterances),
    the class count and the objective."""
    import numpy as np

    from asrflow.nnet.bare import CTC_UNITS, HYBRID_CLASSES
    from asrflow.nnet.data import FeatureDataset

    objective = config["nnet"]["models"][system]["objective"]
    with np.load(root / "targets.npz") as stored:
        targets = {utt: stored[utt] for utt in stored.files}
    dataset = FeatureDataset(root / "data", root / "feats", "train", targets, frame_targets=objective == "hybrid")
    valid = dataset.part(0, max(1, len(dataset) // world))  # about one utterance a learner
    return dataset, valid, HYBRID_CLASSES if objective == "hybrid" else CTC_UNITS, objective


def _worker(argv: list[str] | None = None) -> None:
    """The learner program: train with the given strategy, every learner writes its summary."""
    import torch

    from asrflow.config import load_config
    from asrflow.config.paths import Paths
    from asrflow.config.settings import Parallel
    from asrflow.nnet.stage import train_options, training_data
    from asrflow.nnet.train import train

    p = argparse.ArgumentParser()
    p.add_argument("--config", nargs="+", required=True)
    for name in ("system", "parallel", "summary", "state"):
        p.add_argument(f"--{name}", required=True)
    for name in ("train", "data", "features", "gmm", "synthetic"):
        p.add_argument(f"--{name}")
    p.add_argument("--epochs", type=int, required=True)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--warmup", type=int, default=0, help="steps left out of the timed steps")
    p.add_argument("--pin-from", type=int, help="learner r on core pin_from + r")
    p.add_argument("--trace", help="write per-step metrics to <trace>.rank<r>.jsonl")
    args = p.parse_args(argv)
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    pinned = pin_learner(args.pin_from + rank) if args.pin_from is not None else None
    torch.set_num_threads(args.threads)
    config = load_config(*args.config)
    model = config["nnet"]["models"][args.system]
    if args.synthetic:
        train_set, valid_set, num_classes, objective = _synthetic_data(Path(args.synthetic), config, args.system,
                                                                       world)
        extra = None
    else:
        targets, train_set, valid_set, _ = training_data(config, args.system, args.train,
                                                         Paths(data=args.data, features=args.features,
                                                               out=Path(args.state), gmm=args.gmm))
        num_classes, objective, extra = targets.num_classes, model["objective"], targets.extra
    opts = train_options(config, args.system, args.epochs).replace(log_every=1)  # a metric window per step
    shared = json.loads(args.parallel).get("strategy") == "pipeline"  # every stage reads every batch
    clock = StepClock(args.warmup, 1 if shared else world)
    with contextlib.ExitStack() as stack:  # the trace file stays open for the whole training run
        trace = (stack.enter_context(open(f"{args.trace}.rank{rank}.jsonl", "w")) if args.trace else None)
        began = time.perf_counter()

        def log_step(step: int, metrics: dict[str, Any]) -> None:
            clock.add(step, metrics)
            if trace is not None:
                trace.write(json.dumps({"step": step, "seconds": time.perf_counter() - began, **metrics}) + "\n")

        summary = train(model, opts, train_set, valid_set, num_classes, Path(args.state) / "out",
                        log_metrics=log_step, log=lambda m: None, objective=objective, extra=extra,
                        state_dir=Path(args.state) / "state", parallel=Parallel.defaults(**json.loads(args.parallel)))
    summary.update(timed=clock.summary(), pinned=pinned, threads=args.threads)
    Path(f"{args.summary}.{rank}").write_text(json.dumps(summary))


if __name__ == "__main__":
    _worker()
