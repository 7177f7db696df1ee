"""How GMM training's cost and memory grow with the corpus: ``asrflow bench scale``.

A training split is replicated to each size asked for (copies of its utterances and speakers
under new ids, pointing at the same stored features, so no audio is read again) and a trained
system runs the two E-steps of a training iteration over it on a fresh Dask cluster: a
realignment and an accumulation, their statistics summed on the workers
(:func:`asrflow.cluster.run_reduced`). One JSON line per size:

- ``realign_seconds``, ``accumulate_seconds`` and their sum per hour of audio (flat when the cost
  is linear);
- ``driver_rss_mb`` (the stage's process after the passes, holding the alignments),
  ``alignments_mb`` (their int32 frames) and ``reduced_mb`` (the one total the driver receives:
  the size of the model's statistics, whatever the corpus);
- ``worker_rss_mb``: the largest worker's peak memory, ``worker_rss_after_mb`` its memory after the
  passes, ``worker_cache_mb`` what its caches hold then and ``cache_mb`` their budget
  (``dask.cache_mb``; past it features and graphs are rebuilt rather than kept);
- ``read_alignments_seconds`` / ``read_rss_mb``: writing the alignments as Kaldi archives and
  reading them back lazily, every utterance once.

With ``--stages`` it also writes one line per stage and size in the keys every stage shares
(``stage``, ``hours``, ``wall_s``, ``cpu_s`` of the driver and workers, ``peak_rss_driver_mb``
sampled while the stage ran, ``peak_rss_worker_mb`` the largest worker's peak so far):
``realign``, ``accumulate``, ``tree`` (tree statistics from the new alignments and the tree
built from them), ``fmllr`` (one pass of fMLLR statistics and a transform for every speaker; each
copy of a speaker is a new one), ``alignments`` and ``nnet_read`` (one epoch of the networks'
data path over the replicated split: read, CMVN, pad; no model). Each size runs in a process of
its own, so the driver's memory is that size's alone.
"""

from __future__ import annotations

import multiprocessing
import pickle
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from asrflow.cluster import broadcast, dask_client, peak_memory, run_reduced
from asrflow.data.datadir import read_table
from asrflow.features.ark import read_scp
from asrflow.gmm.alignments import StoredAlignments, read_alignments, shard_alignments, write_alignments
from asrflow.gmm.estep import AlignOptions
from asrflow.gmm.lda import gmm_features
from asrflow.gmm.model import GmmModel
from asrflow.gmm.shards import split_shards
from asrflow.gmm.train import estep_task
from asrflow.gmm.update import merge_results


def replicate(data_dir: Path, feats_dir: Path, split: str, hours: float, out: Path) -> dict[str, Any]:
    """Write ``out/data/<split>`` and ``out/features/<split>``: copies ``c<k>-`` of ``split``'s utterances and
    speakers (the last copy cut short) until they hold ``hours`` of audio; their counts."""
    frames = {u: int(n) for u, n in read_table(feats_dir / split / "utt2num_frames").items()}
    text, utt2spk = read_table(data_dir / split / "text"), read_table(data_dir / split / "utt2spk")
    feats, cmvn = read_scp(feats_dir / split / "feats.scp"), read_scp(feats_dir / split / "cmvn.scp")
    utts = sorted(u for u in frames if u in text and u in feats)
    target = hours * 360_000  # frames of 10 ms
    lines: dict[str, list[str]] = {name: [] for name in ("text", "utt2spk", "feats.scp", "utt2num_frames")}
    speakers: set[str] = set()
    total, copy = 0, 0
    while total < target:
        for utt in utts:
            if total >= target:
                break
            new, spk = f"c{copy}-{utt}", f"c{copy}-{utt2spk[utt]}"
            lines["text"].append(f"{new} {text[utt]}")
            lines["utt2spk"].append(f"{new} {spk}")
            lines["feats.scp"].append(f"{new} {feats[utt]}")
            lines["utt2num_frames"].append(f"{new} {frames[utt]}")
            speakers.add(spk)
            total += frames[utt]
        copy += 1
    for folder, names in ((out / "data" / split, ("text", "utt2spk")),
                          (out / "features" / split, ("feats.scp", "utt2num_frames"))):
        folder.mkdir(parents=True, exist_ok=True)
        for name in names:
            (folder / name).write_text("".join(sorted(line + "\n" for line in lines[name])))
    (out / "features" / split / "cmvn.scp").write_text(
        "".join(f"{spk} {cmvn[spk.split('-', 1)[1]]}\n" for spk in sorted(speakers)))
    return {"utterances": len(lines["text"]), "speakers": len(speakers), "frames": total, "copies": copy}


def _rss_mb() -> float:
    """This process's resident memory now (MB)."""
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def _worker_memory() -> tuple[float, float]:
    """A worker's resident memory now and what its caches hold (MB)."""
    from asrflow.gmm import estep

    return _rss_mb(), (estep._FEATURES.used + estep._GRAPHS.used) / 2**20


class PeakSampler:
    """This process's resident memory sampled in a background thread while the block runs: its peak (MB)."""

    def __init__(self, every: float = 0.05) -> None:
        self.every, self.peak = every, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="asrflow-rss")

    def _run(self) -> None:
        while True:
            self.peak = max(self.peak, _rss_mb())
            if self._stop.wait(self.every):
                return

    def __enter__(self) -> PeakSampler:
        self.peak = _rss_mb()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss_mb())


def _cpu_seconds() -> float:
    """CPU time (user + system) of this process so far."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _workers_cpu(client: Any) -> float:
    """CPU time of every worker process so far, summed."""
    return sum(client.run(_cpu_seconds).values())


def stage_line(stage: str, hours: float, wall: float, cpu: float, driver_mb: float, worker_mb: float | None,
               **extra: Any) -> dict[str, Any]:
    """One JSON line of the scale benchmark: a stage at a corpus size (the keys every stage shares)."""
    return {"stage": stage, "hours": round(hours, 2), "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
            "wall_s_per_hour": round(wall / max(hours, 1e-9), 3), "peak_rss_driver_mb": round(driver_mb, 1),
            "peak_rss_worker_mb": None if worker_mb is None else round(worker_mb, 1), **extra}


def _read_epoch(root: Path, split: str) -> tuple[int, float]:
    """Frames of one epoch of the networks' data path over the replicated split (read, CMVN, pad; no model)."""
    import torch

    from asrflow.config.settings import Training
    from asrflow.nnet.bare import data_path_fps
    from asrflow.nnet.data import FeatureDataset

    dataset = FeatureDataset(root / "data", root / "features", split)
    opts = Training.defaults(max_frames=20000, loader_workers=0, prefetch=2)
    result = data_path_fps(dataset, opts, "hybrid", torch.device("cpu"))
    return sum(dataset.lengths), result["padding"]


def scale_benchmark(config: dict[str, Any], data_dir: str | Path, feats_dir: str | Path, lang_dir: str | Path,
                    model_dir: str | Path, split: str, hours: list[float], workers: int, log=print,
                    stages: list[dict] | None = None) -> list[dict]:
    """One realign and one accumulate E-step of the system in ``model_dir`` over ``split`` replicated to each of
    ``hours``, each size in a fresh process (so its driver's peak memory is its own) with a fresh local cluster
    of ``workers`` processes; one row per size. ``stages``, when given, receives one :func:`stage_line` per stage
    and size: ``realign``, ``accumulate``, ``tree`` (tree statistics from the alignments, and the tree),
    ``fmllr`` (one pass of every speaker's statistics and transform), ``alignments`` (writing and reading them
    back) and ``nnet_read`` (one epoch of the networks' data path)."""
    rows = []
    spawn = multiprocessing.get_context("spawn")
    for target in hours:
        with ProcessPoolExecutor(1, mp_context=spawn) as pool:
            row, lines = pool.submit(_one_size, config, Path(data_dir), Path(feats_dir), Path(lang_dir),
                                     Path(model_dir), split, target, workers).result()
        log(f"{row['hours']} h: realign {row['realign_seconds']} s, accumulate {row['accumulate_seconds']} s "
            f"({row['seconds_per_hour']} s/h), driver {row['driver_rss_mb']} MB, worker peak "
            f"{row['worker_rss_mb']} MB")
        rows.append(row)
        if stages is not None:
            stages += lines
    return rows


class _Stage:
    """Wall time, CPU time of the driver and workers, and the driver's sampled peak memory of one stage."""

    def __init__(self, client: Any | None = None) -> None:
        self.client = client

    def __enter__(self) -> _Stage:
        self.cpu = _cpu_seconds() + (_workers_cpu(self.client) if self.client is not None else 0.0)
        self.sampler = PeakSampler().__enter__()
        self.start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall = time.perf_counter() - self.start
        self.sampler.__exit__(*exc)
        self.driver = self.sampler.peak
        self.cpu = _cpu_seconds() + (_workers_cpu(self.client) if self.client is not None else 0.0) - self.cpu
        self.worker = peak_memory(self.client)["peak_rss_worker_mb"] if self.client is not None else None

    def line(self, stage: str, hours: float, **extra: Any) -> dict[str, Any]:
        return stage_line(stage, hours, self.wall, self.cpu, self.driver, self.worker, **extra)


def _one_size(config: dict[str, Any], data_dir: Path, feats_dir: Path, lang_dir: Path, model_dir: Path,
              split: str, target: float, workers: int) -> tuple[dict[str, Any], list[dict]]:
    """The benchmark at one size (run in a process of its own): its row and its stage lines."""
    from asrflow.decode.decoder import gmm_decode_options
    from asrflow.gmm.adapt import AdaptOptions, adapt_pass
    from asrflow.gmm.train import tree_model

    model = GmmModel.load(model_dir)
    cfg = config["gmm"]["mono"]
    opts = AlignOptions(beam=cfg["beam"], retry_beam=cfg["retry_beam"])
    lines: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="asrflow-scale-") as tmp:
        root = Path(tmp)
        counts = replicate(data_dir, feats_dir, split, target, root)
        hours = counts["frames"] / 360_000
        shards = split_shards(root / "data", root / "features", lang_dir, split, config["gmm"]["shard_utts"],
                              **gmm_features(model_dir))
        units = [len(s.utts) for s in shards]
        dask_cfg = {**config["dask"], "workers": workers, "dashboard": False, "single_worker_thread": False}
        with dask_client(dask_cfg, log=lambda *_: None) as client:
            blob = broadcast(client, model.to_bytes())
            with _Stage(client) as realign:
                totals = run_reduced(client, estep_task, [(s, None) for s in shards], blob, "realign", opts,
                                     str(root / "ali.parts"), combine=merge_results, units=units,
                                     desc=f"realign-{target}h")
            alignments = StoredAlignments(totals.alignments)
            totals.alignments = None
            lines.append(realign.line("realign", hours, workers=workers, utterances=counts["utterances"],
                                      failed=len(totals.failed)))
            with _Stage(client) as accumulate:
                accumulated = run_reduced(client, estep_task, [(s, shard_alignments(alignments, s.utts))
                                                               for s in shards],
                                          blob, "accumulate", opts, combine=merge_results, units=units,
                                          desc=f"accumulate-{target}h")
            reduced_mb = round(len(pickle.dumps(accumulated)) / 2**20, 2)
            lines.append(accumulate.line("accumulate", hours, workers=workers, reduced_mb=reduced_mb))
            tri = config["gmm"]["tri"]
            with _Stage(client) as tree:
                _, info = tree_model(config, tri, shards, lang_dir, model, alignments, client, lambda *_: None,
                                      "tri")
            lines.append(tree.line("tree", hours, workers=workers, leaves=info["leaves"]))
            adapt = AdaptOptions(gmm_decode_options(config["decode"]), opts, config["fmllr"]["silence_weight"])
            transforms: dict = {}
            with _Stage(client) as fmllr:
                adapt_pass(client, shards, alignments, blob, "", transforms, adapt, config["fmllr"], {},
                           f"fmllr-{target}h", config["dask"]["retries"])
            lines.append(fmllr.line("fmllr", hours, workers=workers, speakers=counts["speakers"],
                                    adapted=len(transforms)))
            worker_now, worker_cache = (max(v) for v in zip(*client.run(_worker_memory).values()))
        with _Stage() as written:
            write_alignments(root / "ali", model.tid2pdf, model.tid_tables[0], alignments)
            del alignments
            frames = sum(len(ali) for ali in read_alignments(root / "ali").values())
        lines.append(written.line("alignments", hours, alignments_mb=round(frames * 4 / 2**20, 1)))
        with _Stage() as read:
            read_frames, padding = _read_epoch(root, split)
        lines.append(read.line("nnet_read", hours, frames_per_second=round(read_frames / max(read.wall, 1e-9)),
                               padding=round(padding, 4)))
    row = {"hours": round(hours, 2), "utterances": counts["utterances"], "speakers": counts["speakers"],
           "shards": len(shards), "workers": workers, "gaussians": model.am.num_gauss,
           "realign_seconds": round(realign.wall, 2), "accumulate_seconds": round(accumulate.wall, 2),
           "seconds_per_hour": round((realign.wall + accumulate.wall) / hours, 3),
           "driver_rss_mb": round(max(realign.driver, accumulate.driver), 1),
           "alignments_mb": round(frames * 4 / 2**20, 1), "reduced_mb": reduced_mb,
           "worker_rss_mb": round(accumulate.worker, 1), "worker_rss_after_mb": round(worker_now, 1),
           "worker_cache_mb": round(worker_cache, 1), "cache_mb": config["dask"]["cache_mb"],
           "read_alignments_seconds": round(written.wall, 2), "read_rss_mb": round(written.driver, 1),
           "failed": len(totals.failed)}
    return row, lines
