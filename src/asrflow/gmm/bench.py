"""E-step benchmark: one realign + accumulate pass of a trained model with 1..N Dask workers.

Caches are warmed by a first pass (features loaded, training graphs compiled on every
worker), so the timed passes measure what a training iteration costs. The alignment
real-time factor is the summed in-task alignment time over the audio duration.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from asrflow.cluster import broadcast, dask_client, run_sharded
from asrflow.gmm.estep import AlignOptions
from asrflow.gmm.model import GmmModel
from asrflow.gmm.shards import split_shards
from asrflow.gmm.train import _estep_args
from asrflow.gmm.update import sum_results


def run_benchmark(config: dict[str, Any], data_dir: str | Path, feats_dir: str | Path, lang_dir: str | Path,
                  model_dir: str | Path, train: str, workers: list[int], repeats: int = 3, log=print) -> dict:
    """Time realign and accumulate E-steps; returns a report with speedups vs the first worker count."""
    model = GmmModel.load(model_dir)
    shards = split_shards(data_dir, feats_dir, lang_dir, train, config["gmm"]["shard_utts"])
    report: dict[str, Any] = {"utterances": sum(len(s.utts) for s in shards), "shards": len(shards),
                              "gaussians": model.am.num_gauss, "pdfs": model.am.num_pdfs, "runs": {}}
    opts = AlignOptions(beam=config["gmm"]["mono"]["beam"], retry_beam=config["gmm"]["mono"]["retry_beam"])
    quiet = lambda *_: None  # noqa: E731
    for n in workers:
        with dask_client({**config["dask"], "workers": n, "dashboard": False, "single_worker_thread": False},
                         log=quiet) as client:  # worker processes at every count, so 1 and 2 compare
            blob = broadcast(client, model.to_bytes())
            items = [(s, None) for s in shards]
            warm = run_sharded(client, _estep_args, items, blob, "realign", opts, desc="warm-up")
            alignments = {u: a for r in warm for u, a in r.alignments.items()}
            frames = sum_results(warm).frames
            timings: dict[str, float] = {}
            for mode in ("realign", "accumulate"):
                args = items if mode == "realign" else [(s, {u: alignments[u] for u in s.utts if u in alignments})
                                                         for s in shards]
                best, in_task = float("inf"), 0.0
                for _ in range(repeats):
                    start = time.perf_counter()
                    results = run_sharded(client, _estep_args, args, blob, mode, opts, desc=mode)
                    elapsed = time.perf_counter() - start
                    if elapsed < best:
                        best, in_task = elapsed, sum(r.seconds for r in results)
                timings[mode] = best
                timings[f"{mode}_in_task"] = in_task
            audio = frames * 0.01
            report["runs"][n] = {"realign_seconds": round(timings["realign"], 3),
                                 "accumulate_seconds": round(timings["accumulate"], 3),
                                 "align_rtf": round(timings["realign_in_task"] / audio, 5)}
            log(f"{n} worker(s): realign {timings['realign']:.2f} s, accumulate {timings['accumulate']:.2f} s, "
                f"alignment RTF {timings['realign_in_task'] / audio:.4f}")
    first = report["runs"][workers[0]]
    for row in report["runs"].values():
        row["realign_speedup"] = round(first["realign_seconds"] / row["realign_seconds"], 2)
        row["accumulate_speedup"] = round(first["accumulate_seconds"] / row["accumulate_seconds"], 2)
        row["iteration_speedup"] = round((first["realign_seconds"] + first["accumulate_seconds"])
                                         / (row["realign_seconds"] + row["accumulate_seconds"]), 2)
    return report
