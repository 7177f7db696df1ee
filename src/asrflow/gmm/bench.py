"""GMM benchmarks.

- E-step: one realign + accumulate pass of a trained model with 1..N Dask workers. Caches are
  warmed by a first pass (features loaded, training graphs compiled on every worker), so the
  timed passes measure what a training iteration costs. The alignment real-time factor is the
  summed in-task alignment time over the audio duration.
- Decoding: every n-th utterance of a test split decoded in this process (one core) at each
  beam / max-active and acoustic scale asked for: its RTF and WER, one JSON line per setting.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from asrflow.cluster import broadcast, dask_client, run_sharded
from asrflow.gmm.alignments import references
from asrflow.gmm.estep import AlignOptions, features
from asrflow.gmm.lda import gmm_features
from asrflow.gmm.model import GmmModel
from asrflow.gmm.shards import split_shards
from asrflow.gmm.train import estep_task


def run_benchmark(config: dict[str, Any], data_dir: str | Path, feats_dir: str | Path, lang_dir: str | Path,
                  model_dir: str | Path, train: str, workers: list[int], repeats: int = 3, log=print) -> dict:
    """Time realign and accumulate E-steps; returns a report with speedups vs the first worker count."""
    model = GmmModel.load(model_dir)
    shards = split_shards(data_dir, feats_dir, lang_dir, train, config["gmm"]["shard_utts"], **gmm_features(model_dir))
    report: dict[str, Any] = {"utterances": sum(len(s.utts) for s in shards), "shards": len(shards),
                              "gaussians": model.am.num_gauss, "pdfs": model.am.num_pdfs, "runs": {}}
    opts = AlignOptions(beam=config["gmm"]["mono"]["beam"], retry_beam=config["gmm"]["mono"]["retry_beam"])
    quiet = lambda *_: None  # noqa: E731
    for n in workers:
        with dask_client({**config["dask"], "workers": n, "dashboard": False, "single_worker_thread": False},
                         log=quiet) as client:  # worker processes at every count, so 1 and 2 compare
            blob = broadcast(client, model.to_bytes())
            items = [(s, None) for s in shards]
            warm = run_sharded(client, estep_task, items, blob, "realign", opts, desc="warm-up")
            alignments = {u: a for r in warm for u, a in references(r.alignments).items()}
            frames = sum(r.frames for r in warm)
            timings: dict[str, float] = {}
            for mode in ("realign", "accumulate"):
                args = items if mode == "realign" else [(s, {u: alignments[u] for u in s.utts if u in alignments})
                                                         for s in shards]
                best, in_task = float("inf"), 0.0
                for _ in range(repeats):
                    start = time.perf_counter()
                    results = run_sharded(client, estep_task, args, blob, mode, opts, desc=mode)
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


def decode_benchmark(config: dict[str, Any], model_dir: str | Path, graph_dir: str | Path, data_dir: str | Path,
                     feats_dir: str | Path, lang_dir: str | Path, test: str, every: int,
                     searches: list[tuple[float, int]], scales: list[float], adapted: bool = False,
                     lattice: bool = False, vector: bool = False, log=print) -> list[dict[str, Any]]:
    """Decode every ``every``-th utterance of ``test`` (sorted ids) with the GMM in ``model_dir`` through its HCLG
    at each (beam, max-active) of ``searches`` and acoustic scale of ``scales``, in this process; one row per
    setting with the one-core RTF (the GMM's likelihoods, computed once as the decode stage does, and the
    search), the search's alone, utterances that reached no final state, and the WER. With ``lattice`` the
    same likelihoods are searched again by Kaldi's lattice-faster decoder (:func:`lattice_search`): its search
    time, the speed-up and the utterances whose words differ join the row; with ``vector`` likewise through the
    graph held as a VectorFst (:func:`vector_search`)."""
    from dataclasses import replace

    from asrflow.data.datadir import read_table
    from asrflow.decode import decoder
    from asrflow.kaldi import khg
    from asrflow.score.wer import score_corpus

    texts = read_table(Path(data_dir) / test / "text")
    chosen = set(sorted(texts)[::every])
    shards = split_shards(data_dir, feats_dir, lang_dir, test, len(chosen), only=chosen,
                          **gmm_features(model_dir, adapted))
    model = GmmModel.load(model_dir)
    feats = [x for s in shards for x in features(s)]
    utts = [u for s in shards for u in s.utts]
    graph = str(Path(graph_dir).resolve() / "HCLG.fst")
    base = decoder.gmm_decode_options(config["decode"])
    start = time.perf_counter()
    pdf_scores = [model.pdf_loglikes(x) for x in feats]
    likelihoods = time.perf_counter() - start
    rows = []
    for beam, max_active in searches:
        for scale in scales:
            opts = replace(base, beam=beam, max_active=max_active, acoustic_scale=scale)
            start = time.perf_counter()
            matrices = [decoder.transition_columns(p, model.tid2pdf, scale) for p in pdf_scores]
            layout = time.perf_counter() - start
            items = [(u, len(m), lambda m=m: khg.DecodableCtc(m)) for u, m in zip(utts, matrices)]
            result = decoder.decode_all(graph, opts, items)
            summary, _ = score_corpus({u: texts[u] for u in utts}, {u: " ".join(w) for u, w in result.hyps.items()})
            audio = result.frames * 0.01
            row = {"model": str(model_dir), "test": test, "every": every, "utterances": len(utts), "beam": beam,
                   "max_active": max_active, "acoustic_scale": scale,
                   "rtf": round((likelihoods + layout + result.seconds) / audio, 4),
                   "rtf_search": round(result.seconds / audio, 4), "partial_paths": len(result.partial),
                   "wer": round(summary["wer"], 4), "sub": summary["sub"], "del": summary["del"], "ins": summary["ins"]}
            if lattice:
                row.update(decoder.lattice_comparison(graph, model.tm, opts, items, result))
            if vector:
                row.update(decoder.vector_comparison(graph, opts, items, result))
            rows.append(row)
            log(f"beam {beam} max-active {max_active} scale {scale}: RTF {row['rtf']} (search {row['rtf_search']}"
                + (f", lattice-faster's {row['lattice_rtf_search']}" if lattice else "")
                + f"), WER {100 * row['wer']:.2f} %")
    return rows
