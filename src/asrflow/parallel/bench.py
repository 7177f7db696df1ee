"""``asrflow bench parallel``: real speedup of each strategy on this machine, beside the timing model.

Every strategy trains the same network on the same data (the whole training split, the
same number of epochs) with 1 and more learner processes under ``torchrun`` on loopback
gloo; the single-learner run is the baseline. The speedup is measured on training time
(held-out evaluations excluded) and printed beside the timing model's prediction from the
times the learners measured (:mod:`asrflow.parallel.timing`). Run as a module it is the
learner program that ``torchrun`` starts.
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

from asrflow.parallel.timing import StepTimes, predict_speedup

ROW_KEYS = ("strategy", "learners", "compression", "batch", "measured_speedup", "predicted_speedup",
            "split_efficiency", "predicted_split", "t_calc", "t_transmit", "t_merge", "bytes_per_step")


def free_port() -> int:
    """A TCP port free on the loopback address now (a torchrun rendezvous on 127.0.0.1)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_learners(config_files: list[str], system: str, paths: dict[str, str], parallel: dict[str, Any],
                 epochs: int, threads: int, timeout: float = 3600,
                 trace: str | Path | None = None) -> list[dict[str, Any]]:
    """Train ``system`` with ``parallel['learners']`` processes; every learner's training summary.

    With ``trace`` every learner writes its per-step metrics (the step's times, loss, learning
    rate, seconds since training began) to ``<trace>.rank<r>.jsonl``.
    """
    with tempfile.TemporaryDirectory(prefix="asrflow-bench-") as tmp:
        summary = Path(tmp) / "summary.json"
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(parallel["learners"]),
               "--master-addr", "127.0.0.1", "--master-port", str(free_port()), "-m", "asrflow.parallel.bench",
               "--config", *config_files, "--system", system, "--parallel", json.dumps(parallel),
               "--epochs", str(epochs), "--threads", str(threads), "--summary", str(summary), "--state", tmp,
               *[f"--{k}={v}" for k, v in paths.items() if v], *(["--trace", str(trace)] if trace else [])]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "OMP_NUM_THREADS": str(threads)})
        if proc.returncode != 0:
            tail = (proc.stdout + proc.stderr)[-3000:]
            raise RuntimeError(f"bench run {parallel} failed (exit {proc.returncode}):\n{tail}")
        return [json.loads(path.read_text()) for path in sorted(Path(tmp).glob("summary.json.*"))]


def _mean(summaries: list[dict[str, Any]], key: str) -> float:
    return sum(s[key] for s in summaries) / len(summaries)


def split_efficiency(baseline: dict[str, Any], summaries: list[dict[str, Any]]) -> float:
    """How well one learner's work splits: the single learner's local work for the data over ``n`` times a learner's.

    Local work is reading + forward/backward + applying the update (``t_data + t_calc +
    t_merge``) times the steps taken. The timing model assumes the ``n`` learners' local work
    adds up to the single learner's (1.0); with ``batch: global`` each learner step reads
    ``1/n`` of a minibatch, and the per-step costs that do not shrink with the batch (the
    optimiser, Python, small kernels) make it less.
    """
    def work(s: dict[str, Any]) -> float:
        return (s["mean_t_data"] + s["mean_t_calc"] + s["mean_t_merge"]) * s["steps"]

    return work(baseline) / sum(work(s) for s in summaries)


def bench_row(strategy: str, summaries: list[dict[str, Any]], baseline: dict[str, Any],
              parallel: dict[str, Any]) -> dict:
    """One JSON line: measured and predicted speedup with the step times (means over learners) behind it.

    The job takes as long as its slowest learner; bytes are the mean a learner sends per step.
    ``predicted_speedup`` is the timing model on the learners' step times; ``predicted_split``
    also counts the measured :func:`split_efficiency` of the work itself.
    """
    times = StepTimes(calc=_mean(summaries, "mean_t_calc") + _mean(summaries, "mean_t_data"),
                      transmit=_mean(summaries, "mean_t_transmit"), merge=_mean(summaries, "mean_t_merge"),
                      wait=_mean(summaries, "mean_t_wait"))
    summary, learners = summaries[0], len(summaries)
    seconds = max(s["train_seconds"] for s in summaries)
    predicted, efficiency = predict_speedup(strategy, learners, times), split_efficiency(baseline, summaries)
    return {"strategy": strategy, "learners": learners, "compression": parallel.get("compression", "none"),
            "k": parallel.get("k", 4), "overlap": bool(parallel.get("overlap", False)),
            "group_size": parallel.get("group_size", 2),
            "batch": parallel.get("batch", "global"),
            "measured_speedup": baseline["train_seconds"] / seconds,
            "predicted_speedup": predicted, "split_efficiency": efficiency, "predicted_split": predicted * efficiency,
            "t_calc": times.calc, "t_transmit": times.transmit, "t_merge": times.merge, "t_wait": times.wait,
            "bytes_per_step": _mean(summaries, "mean_bytes_per_step"), "train_seconds": seconds,
            "valid_frame_accuracy": summary.get("best_valid_frame_accuracy"),
            "baseline_t_calc": baseline["mean_t_calc"] + baseline["mean_t_data"]}


def bench_parallel(config_files: list[str], system: str, paths: dict[str, str], variants: list[dict[str, Any]],
                   learners: list[int], epochs: int, threads: int = 1, repeats: int = 1,
                   log: Callable[[str], None] = print, trace_dir: str | Path | None = None,
                   pairing: str = "before") -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The single-learner baseline summary and one row per (variant, learner count > 1).

    The machine may be shared and its speed drift over minutes, so every parallel run is
    paired with a single-learner run, and the speedup is the median over ``repeats`` pairs
    of (baseline time / parallel time), the lower middle one for an even count; the step
    times are those of the median pair. ``pairing`` says when the pair's single learner
    runs: ``before`` the parallel run, or ``concurrent`` with it, on other cores, so both
    see the same drift of the machine (only where cores are spare: a learner per core and
    one more). With ``trace_dir`` every run's learners write their per-step times there
    (``<run>.rank<r>.jsonl``, runs numbered in order).
    """
    if pairing not in ("before", "concurrent"):
        raise ValueError(f"pairing must be before or concurrent, not {pairing!r}")
    runs = iter(range(10 ** 6))

    def trace(name: str) -> Path | None:
        return Path(trace_dir) / f"{next(runs):03d}-{name}" if trace_dir else None

    def single() -> dict[str, Any]:
        return run_learners(config_files, system, paths, {"strategy": "allreduce", "learners": 1}, epochs, threads,
                            trace=trace("single"))[0]

    def pair(parallel: dict[str, Any], fresh_baseline: bool) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        name = "-".join(str(parallel[k]) for k in ("strategy", "learners", "compression", "k") if k in parallel) + (
            "-overlap" if parallel.get("overlap") else "")
        if pairing == "concurrent":
            with ThreadPoolExecutor(2) as pool:
                baseline = pool.submit(single)
                summaries = pool.submit(run_learners, config_files, system, paths, parallel, epochs, threads,
                                        trace=trace(name))
                return baseline.result(), summaries.result()
        baseline = single() if fresh_baseline else first
        return baseline, run_learners(config_files, system, paths, parallel, epochs, threads, trace=trace(name))

    if trace_dir:
        Path(trace_dir).mkdir(parents=True, exist_ok=True)
    first = single()
    log(f"1 learner: {first['train_seconds']:.1f} s, held-out frame accuracy {first.get('best_valid_frame_accuracy')}")
    rows = []
    for variant in variants:
        for n in [variant["learners"]] if "learners" in variant else learners:
            if n == 1:
                continue
            parallel = {**variant, "learners": n}
            pairs = []
            for repeat in range(repeats):
                baseline, summaries = pair(parallel, fresh_baseline=bool(rows) or repeat > 0)
                pairs.append(bench_row(variant["strategy"], summaries, baseline, parallel))
                log(f"  pair {repeat + 1} ({pairing}): 1 learner {baseline['train_seconds']:.2f} s, {n} learners "
                    f"{pairs[-1]['train_seconds']:.2f} s: {pairs[-1]['measured_speedup']:.3f}x")
            pairs.sort(key=lambda r: r["measured_speedup"])
            # the median pair; with an even count the lower of the two middle ones (never flattering)
            row = {**pairs[(len(pairs) - 1) // 2], "pairing": pairing,
                   "measured_speedups": [round(r["measured_speedup"], 3) for r in pairs]}
            log(json.dumps({k: row[k] for k in (*ROW_KEYS, "measured_speedups")}))
            rows.append(row)
    return first, rows


def table(rows: list[dict[str, Any]]) -> str:
    """Human-readable table of bench rows."""
    lines = [f"{'strategy':<13}{'compr':>6}{'n':>3}{'measured':>10}{'predicted':>10}{'split eff':>10}"
             f"{'pred×eff':>9}{'T_calc ms':>10}"
             f"{'T_trans ms':>11}{'T_merge ms':>11}{'T_wait ms':>10}{'bytes/step':>12}{'frame acc':>10}"]
    for r in rows:
        acc = r.get("valid_frame_accuracy")
        efficiency = r.get("split_efficiency", float("nan"))
        label = r["strategy"] + ("+overlap" if r.get("overlap") else "")
        lines.append(f"{label:<13}{r['compression']:>6}{r['learners']:>3}{r['measured_speedup']:>10.2f}"
                     f"{r['predicted_speedup']:>10.2f}{efficiency:>10.2f}{r['predicted_speedup'] * efficiency:>9.2f}"
                     f"{r['t_calc'] * 1e3:>10.1f}{r['t_transmit'] * 1e3:>11.2f}"
                     f"{r['t_merge'] * 1e3:>11.2f}{r['t_wait'] * 1e3:>10.2f}{r['bytes_per_step']:>12.0f}"
                     f"{(acc if acc is not None else float('nan')):>10.4f}")
    return "\n".join(lines)


def _worker(argv: list[str] | None = None) -> None:
    """The learner program: train with the given strategy, learner 0 writes the summary."""
    import torch

    from asrflow.config import load_config
    from asrflow.config.paths import Paths
    from asrflow.config.settings import Parallel
    from asrflow.nnet.stage import train_options, training_data
    from asrflow.nnet.train import train

    p = argparse.ArgumentParser()
    p.add_argument("--config", nargs="+", required=True)
    for name in ("system", "parallel", "summary", "state", "train", "data", "features"):
        p.add_argument(f"--{name}", required=True)
    p.add_argument("--gmm")
    p.add_argument("--epochs", type=int, required=True)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--trace", help="write per-step metrics to <trace>.rank<r>.jsonl")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    config = load_config(*args.config)
    targets, train_set, valid_set, _ = training_data(config, args.system, args.train,
                                                     Paths(data=args.data, features=args.features, out=Path(args.state),
                                                           gmm=args.gmm))
    opts = train_options(config, args.system, args.epochs)
    model = config["nnet"]["models"][args.system]
    with contextlib.ExitStack() as stack:  # the trace file stays open for the whole training run
        trace = (stack.enter_context(open(f"{args.trace}.rank{os.environ.get('RANK', '0')}.jsonl", "w"))
                 if args.trace else None)
        began = time.perf_counter()

        def log_step(step: int, metrics: dict[str, Any]) -> None:
            if trace is not None:
                trace.write(json.dumps({"step": step, "seconds": time.perf_counter() - began, **metrics}) + "\n")

        summary = train(model, opts, train_set, valid_set, targets.num_classes, Path(args.state) / "out",
                        log_metrics=log_step, log=lambda m: None, objective=model["objective"], extra=targets.extra,
                        state_dir=Path(args.state) / "state", parallel=Parallel.defaults(**json.loads(args.parallel)))
    Path(f"{args.summary}.{os.environ.get('RANK', '0')}").write_text(json.dumps(summary))


if __name__ == "__main__":
    _worker()
