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
``realign``, ``accumulate``, ``alignments`` and ``nnet_read`` (one epoch of the networks' data
path over the replicated split: read, CMVN, pad; no model).
"""

from __future__ import annotations

import pickle
import tempfile
import threading
import time
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
    ``hours``, on a fresh local cluster of ``workers`` processes each time; one row per size. ``stages``, when
    given, receives one :func:`stage_line` per stage and size: ``realign``, ``accumulate``, ``alignments``
    (writing and reading them back) and ``nnet_read`` (one epoch of the networks' data path)."""
    model = GmmModel.load(model_dir)
    cfg = config["gmm"]["mono"]
    opts = AlignOptions(beam=cfg["beam"], retry_beam=cfg["retry_beam"])
    rows = []
    for target in hours:
        with tempfile.TemporaryDirectory(prefix="asrflow-scale-") as tmp:
            root = Path(tmp)
            counts = replicate(Path(data_dir), Path(feats_dir), split, target, root)
            audio_hours = counts["frames"] / 360_000
            shards = split_shards(root / "data", root / "features", lang_dir, split, config["gmm"]["shard_utts"],
                                  **gmm_features(model_dir))
            dask_cfg = {**config["dask"], "workers": workers, "dashboard": False, "single_worker_thread": False}
            with dask_client(dask_cfg, log=lambda *_: None) as client:
                blob = broadcast(client, model.to_bytes())
                units = [len(s.utts) for s in shards]
                cpu, workers_cpu = _cpu_seconds(), _workers_cpu(client)
                start = time.perf_counter()
                with PeakSampler() as driver_peak:
                    totals = run_reduced(client, estep_task, [(s, None) for s in shards], blob, "realign", opts,
                                         str(root / "ali.parts"), combine=merge_results, units=units,
                                         desc=f"realign-{target}h")
                realign = time.perf_counter() - start
                worker_peak_realign = peak_memory(client)["peak_rss_worker_mb"]
                realign_cpu = _cpu_seconds() - cpu + _workers_cpu(client) - workers_cpu
                realign_driver = driver_peak.peak
                alignments = StoredAlignments(totals.alignments)
                totals.alignments = None
                cpu, workers_cpu = _cpu_seconds(), _workers_cpu(client)
                start = time.perf_counter()
                with PeakSampler() as driver_peak:
                    accumulated = run_reduced(
                        client, estep_task,
                        [(s, shard_alignments(alignments, s.utts)) for s in shards],
                        blob, "accumulate", opts, combine=merge_results, units=units, desc=f"accumulate-{target}h")
                accumulate = time.perf_counter() - start
                accumulate_cpu = _cpu_seconds() - cpu + _workers_cpu(client) - workers_cpu
                accumulate_driver = driver_peak.peak
                worker_peak = peak_memory(client)["peak_rss_worker_mb"]
                worker_now, worker_cache = (max(v) for v in zip(*client.run(_worker_memory).values()))
            driver = _rss_mb()
            cpu = _cpu_seconds()
            start = time.perf_counter()
            with PeakSampler() as driver_peak:
                write_alignments(root / "ali", model.tid2pdf, model.tid_tables[0], alignments)
                del alignments
                frames = 0
                for ali in read_alignments(root / "ali").values():
                    frames += len(ali)
            read_seconds = time.perf_counter() - start
            read_cpu, read_driver = _cpu_seconds() - cpu, driver_peak.peak
            cpu = _cpu_seconds()
            start = time.perf_counter()
            with PeakSampler() as driver_peak:
                read_frames, padding = _read_epoch(root, split)
            nnet_read = time.perf_counter() - start
            if stages is not None:
                stages += [
                    stage_line("realign", audio_hours, realign, realign_cpu, realign_driver, worker_peak_realign,
                               workers=workers, utterances=counts["utterances"], failed=len(totals.failed)),
                    stage_line("accumulate", audio_hours, accumulate, accumulate_cpu, accumulate_driver, worker_peak,
                               workers=workers, reduced_mb=round(len(pickle.dumps(accumulated)) / 2**20, 2)),
                    stage_line("alignments", audio_hours, read_seconds, read_cpu, read_driver, None,
                               alignments_mb=round(frames * 4 / 2**20, 1)),
                    stage_line("nnet_read", audio_hours, nnet_read, _cpu_seconds() - cpu, driver_peak.peak, None,
                               frames_per_second=round(read_frames / max(nnet_read, 1e-9)),
                               padding=round(padding, 4))]
        row = {"hours": round(audio_hours, 2), "utterances": counts["utterances"], "speakers": counts["speakers"],
               "shards": len(shards), "workers": workers, "gaussians": model.am.num_gauss,
               "realign_seconds": round(realign, 2), "accumulate_seconds": round(accumulate, 2),
               "seconds_per_hour": round((realign + accumulate) / audio_hours, 3),
               "driver_rss_mb": round(driver, 1), "alignments_mb": round(frames * 4 / 2**20, 1),
               "reduced_mb": round(len(pickle.dumps(accumulated)) / 2**20, 2),
               "worker_rss_mb": round(worker_peak, 1), "worker_rss_after_mb": round(worker_now, 1),
               "worker_cache_mb": round(worker_cache, 1), "cache_mb": config["dask"]["cache_mb"],
               "read_alignments_seconds": round(read_seconds, 2), "read_rss_mb": round(_rss_mb(), 1),
               "failed": len(totals.failed)}
        log(f"{row['hours']} h: realign {row['realign_seconds']} s, accumulate {row['accumulate_seconds']} s "
            f"({row['seconds_per_hour']} s/h), driver {row['driver_rss_mb']} MB, worker peak "
            f"{row['worker_rss_mb']} MB")
        rows.append(row)
    return rows
