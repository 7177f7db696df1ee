"""The scale benchmark's driver: each size made once, each stage's driver a fresh process, one JSON line each.

A size is made from audio (:func:`~asrflow.scale.corpus.sized_corpus`, when ``audio_cache`` is given and the
``import`` stage asked for: then ``import`` and ``features`` make its data and features) or by replicating
the split's stored features (:func:`~asrflow.scale.gmm.replicate`). Each stage's driver is a process of its
own (its peak resident memory is the stage's, not what earlier stages left behind), and a stage that starts a
workflow job gets a local Dask cluster of its own (:func:`jobs`), as every job of a workflow starts its own
workers (a local cluster, or Slurm worker jobs). A stage that continues the job of the stage before it
(:data:`CONTINUES`: a training job's accumulating pass after its aligning one) runs on the workers that stage
left, with their caches and heap. One JSON line per stage and size: ``stage``, ``hours``, ``wall_s``,
``cpu_s`` (driver and workers), ``wall_s_per_hour``, ``peak_rss_driver_mb``, ``peak_rss_worker_mb`` (the
largest worker's peak during the stage: each worker's peak is restarted from what it holds when the stage
starts; none for stages without workers), ``start_rss_worker_mb`` (what the largest worker held when the stage
started), ``fresh_workers`` and the stage's own counts.
"""

from __future__ import annotations

import json
import multiprocessing
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from asrflow.cluster import dask_client, peak_memory
from asrflow.cluster.client import peak_rss_mb, reset_peak_rss
from asrflow.scale import gmm
from asrflow.scale import stages as pipeline
from asrflow.scale.corpus import sized_corpus
from asrflow.scale.size import Size, latest_lines, stage_line

StageFn = Callable[[Size, Any], dict[str, Any]]

#: The stages in the order they run, each with whether it uses the workers.
STAGES: dict[str, tuple[StageFn, bool]] = {
    "import": (pipeline._import, True), "features": (pipeline._features, True), "mono": (gmm._mono, True),
    "realign": (gmm._realign, True), "accumulate": (gmm._accumulate, True), "tree": (gmm._tree, True),
    "fmllr": (gmm._fmllr, True), "alignments": (gmm._alignments, False), "nnet_read": (gmm._nnet_read, False),
    "lang": (pipeline._lang, False), "lang_20k": (pipeline._lang_20k, False), "decode": (pipeline._decode, True),
    "score": (pipeline._score, False), "tune": (pipeline._tune, True), "mlflow": (pipeline._mlflow, False)}

#: Stages that continue the workflow job of the stage named (run right after it, on the workers it left): a
#: training job's passes follow one another on the same workers. Every other stage starts a job of its own.
CONTINUES = {"accumulate": "realign"}

#: What each stage needs to have run before it at the same size.
NEEDS = {"features": "import", "accumulate": "realign", "tree": "realign", "fmllr": "realign",
         "alignments": "realign", "decode": "lang", "score": "decode", "tune": "lang"}


def stage_names(asked: list[str] | None, audio: bool = True) -> list[str]:
    """The stages to run, in :data:`STAGES` order: those ``asked`` and what they need; when None, all (without
    ``import`` and ``features`` unless the sizes are made from ``audio``)."""
    unknown = [n for n in (asked or []) if n not in STAGES]
    if unknown:
        raise ValueError(f"unknown stages {', '.join(unknown)}: {', '.join(STAGES)}")
    wanted = set(asked) if asked is not None else set(STAGES) - (set() if audio else {"import", "features"})
    while missing := {NEEDS[n] for n in wanted if n in NEEDS} - wanted:
        wanted |= missing
    if "import" in wanted:
        wanted.add("features")  # the stages after it read the imported size's features
    return [n for n in STAGES if n in wanted]


def _cpu_seconds() -> float:
    """CPU time (user + system) of this process so far."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _cache_mb() -> float:
    """What a worker's caches hold now (MB)."""
    from asrflow.gmm import estep

    return estep._GRAPHS.used / 2**20


def jobs(names: list[str]) -> list[list[str]]:
    """``names`` (in the order they run) cut where the workflow starts a job with workers of its own: at every
    stage that uses the workers and does not continue the stage just before it (:data:`CONTINUES`). Stages
    without workers go with the job before them (what the workers hold does not touch them)."""
    cut: list[list[str]] = []
    for i, name in enumerate(names):
        starts = STAGES[name][1] and (i == 0 or CONTINUES.get(name) != names[i - 1])
        if starts or not cut:
            cut.append([name])
        else:
            cut[-1].append(name)
    return cut


def _run_stage(name: str, size: Size, address: str) -> dict[str, Any]:
    """Stage ``name`` in this (fresh) process, its driver, on the cluster at ``address``: its JSON line."""
    from dask.distributed import Client

    fn, uses_workers = STAGES[name]
    with Client(address, timeout="60s") as client:
        workers_cpu = sum(client.run(_cpu_seconds).values())
        held = None
        if uses_workers:
            client.run(reset_peak_rss)
            held = max(client.run(peak_rss_mb).values())  # just restarted: what the largest worker holds now
        cpu = _cpu_seconds()
        start = time.perf_counter()
        extra = fn(size, client if uses_workers else None)
        wall = time.perf_counter() - start
        cpu = _cpu_seconds() - cpu + (sum(client.run(_cpu_seconds).values()) - workers_cpu if uses_workers else 0)
        peaks = peak_memory(client)  # this process's, and the largest worker's
        if uses_workers:
            extra["worker_cache_mb"] = round(max(client.run(_cache_mb).values()), 1)
            extra["start_rss_worker_mb"] = round(held, 1)
    return stage_line(name, size.hours, wall, cpu, peaks["peak_rss_driver_mb"],
                      peaks["peak_rss_worker_mb"] if uses_workers else None, **extra)


def _make_size(size: Size, data_dir: Path, feats_dir: Path, target: float, audio_cache: Path | None,
               from_audio: bool, log: Callable[[str], None]) -> tuple[Size, dict[str, Any]]:
    """The size's corpus (audio) or replicated data and features, and its counts."""
    from dataclasses import replace

    if from_audio:
        assert audio_cache is not None
        counts = sized_corpus(data_dir, size.split, target, audio_cache, size.root / "corpus",
                              size.config["audio"]["sample_rate"], size.config["seed"], size.workers, log)
        return replace(size, hours=counts["audio_hours"]), counts
    counts = gmm.replicate(data_dir, feats_dir, size.split, target, size.root)
    return replace(size, hours=counts["frames"] / 360_000), counts


def scale_benchmark(config: dict[str, Any], data_dir: str | Path, feats_dir: str | Path, lang_dir: str | Path,
                    model_dir: str | Path, split: str, hours: list[float], workers: int, log=print,
                    stages: list[str] | None = None, audio_cache: str | Path | None = None, test: str = "test",
                    test_minutes: float = 30.0, tune_utterances: int = 200) -> list[dict]:
    """The stages (:data:`STAGES`, or those named, and what they need) of the system in ``model_dir`` at each of
    ``hours``, on a local cluster of ``workers`` processes per workflow job (:func:`jobs`): one line per stage and
    size.

    ``audio_cache``: where the sized corpora's audio is kept between runs (needed by ``import``);
    ``test``/``test_minutes``: the split of ``data_dir``/``feats_dir`` and the minutes of it every size decodes;
    ``tune_utterances``: the tuning set's cap (``decode.tune.max_utterances`` in a workflow).
    """
    names = stage_names(stages, audio_cache is not None)
    from_audio = "import" in names
    if from_audio and audio_cache is None:
        raise ValueError("the import stage needs an audio cache (--audio-cache) for the sized corpora's audio")
    data_dir, feats_dir = Path(data_dir), Path(feats_dir)
    kind = json.loads((feats_dir / "manifest.json").read_text())["kind"] if (feats_dir / "manifest.json").is_file() \
        else "mfcc"
    spawn = multiprocessing.get_context("spawn")
    lines: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="asrflow-scale-") as tmp:
        test_root = Path(tmp) / "test"
        if {"decode", "score"} & set(names):
            info = pipeline.fixed_test(data_dir, feats_dir, test, test_minutes, test_root)
            log(f"fixed test set: {info['utterances']} utterances of {test}, {info['minutes']} min")
        for target in hours:
            root = Path(tmp) / f"{target:g}h"
            size = Size(config, root, Path(lang_dir), Path(model_dir), split, target, test_root, test, kind, workers,
                        tune_utterances)
            size, counts = _make_size(size, data_dir, feats_dir, target, Path(audio_cache) if audio_cache else None,
                                      from_audio, log)
            dask_cfg = {**config["dask"], "workers": workers, "dashboard": False, "single_worker_thread": False}
            for job in jobs(names):  # each on a cluster of its own, as each workflow job starts one
                with dask_client(dask_cfg, log=lambda *_: None) as client:
                    for name in job:
                        with ProcessPoolExecutor(1, mp_context=spawn) as pool:
                            line = pool.submit(_run_stage, name, size, client.scheduler.address).result()
                        line.update(fresh_workers=STAGES[name][1] and name == job[0], workers=workers,
                                    utterances=counts["utterances"], speakers=counts["speakers"])
                        log(f"{line['hours']} h {name}: {line['wall_s']} s, driver {line['peak_rss_driver_mb']} MB, "
                            f"worker {line['peak_rss_worker_mb']} MB")
                        lines.append(line)
    return lines


def scale_table(lines: list[dict], base: float = 10.0) -> str:
    """A Markdown table of the benchmark's lines (the latest of each stage and size, stages in the order they run):
    seconds per hour of audio, driver and largest-worker peak (MB) at every size, and each one's ratio at the
    largest size to ``base``."""
    stages, latest = latest_lines(lines)
    order = list(STAGES)
    stages = sorted(stages, key=lambda name: order.index(name) if name in order else len(order))  # as they run
    sizes = sorted({hours for _, hours in latest})

    def row(stage: str, key: str, digits: int) -> tuple[str, str]:
        values = {h: latest[(stage, h)][key] for h in sizes if (stage, h) in latest}
        text = " / ".join("–" if values.get(h) is None else f"{values[h]:.{digits}f}" for h in sizes)
        top, low = values.get(sizes[-1]), values.get(base)
        return text, (f"{top / low:.2f}" if top is not None and low else "–")

    head, ratio = " / ".join(f"{h:g}" for h in sizes), f"{sizes[-1]:g} h / {base:g} h"
    out = [f"| stage | s per hour at {head} h | {ratio} | driver MB | {ratio} | largest worker MB | {ratio} |",
           "|---|---|---|---|---|---|---|"]
    for stage in stages:
        cells = [*row(stage, "wall_s_per_hour", 2), *row(stage, "peak_rss_driver_mb", 0),
                 *row(stage, "peak_rss_worker_mb", 0)]
        out.append(f"| {stage} | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"
