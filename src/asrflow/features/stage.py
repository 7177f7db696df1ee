"""The features stage: one feature kind for every valid utterance, on a Dask cluster.

Every valid utterance is the data stage's ``all`` dir plus the speed-perturbed copies its
``<train>_sp`` splits hold (:mod:`asrflow.data.perturb`), resampled as they are read.

Output folder (``results/<exp>/features/<kind>/``)::

    feats.NNNN.ark      one archive per shard (``features.shard_utts`` utterances)
    feats.scp           index of every utterance (Kaldi ``key ark:offset``)
    utt2num_frames
    <split>/feats.scp, <split>/utt2num_frames
    <split>/cmvn.ark, <split>/cmvn.scp   per-speaker CMVN statistics of that split
    report.tsv          utterances that gave no features, and why
    manifest.json       kind, dimension, options, counts (deterministic)
    timing.json         wall time, x-real-time, workers (varies run to run)

Shards are fixed by the config and dither is seeded per utterance, so every file except
``timing.json`` is byte-identical whatever the number of workers, and whether a worker died.
"""

from __future__ import annotations

import heapq
import json
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from asrflow.cluster import chunks, stream_sharded
from asrflow.data.audio import AudioError, read_audio
from asrflow.data.datadir import iter_data_dir
from asrflow.data.perturb import perturb_speed
from asrflow.data.tables import entries, lookup, ordered_rows
from asrflow.data.validate import Utterance
from asrflow.features.ark import atomic_text, decoded, matrix_bytes, write_ark, write_text_atomic
from asrflow.features.compute import FeatureOptions, compute_batch
from asrflow.features.transforms import cmvn_stats

INT16_SCALE = 32768.0


@dataclass
class ShardResult:
    """What one shard task returns to the driver (small: no feature matrices)."""

    scp: list[str]
    num_frames: dict[str, int]
    stats: np.ndarray  # (utterances, 2, dim + 1) CMVN statistics, in scp order
    failed: list[tuple[str, str, str]] = field(default_factory=list)
    audio_seconds: float = 0.0
    seconds: float = 0.0


def load_signal(utt: Utterance, sample_rate: int) -> np.ndarray:
    """Read an utterance at ``sample_rate`` on the int16 scale Kaldi features expect."""
    samples, rate = read_audio(utt.audio, utt.start, utt.end)
    return perturb_speed(samples, rate, utt.speed, sample_rate) * np.float32(INT16_SCALE)


def extract_shard(utts: list[Utterance], opts: FeatureOptions, seed: int, ark: str,
                  compress: bool = False) -> ShardResult:
    """Compute and write one shard's archive (runs on a Dask worker); ``compress``: Kaldi's compressed
    matrices, the CMVN statistics then taken from what the archive holds (as ``compute-cmvn-stats`` reads it)."""
    start = time.perf_counter()
    signals, kept, failed = [], [], []
    for utt in utts:
        try:
            signals.append(load_signal(utt, opts.sample_rate))
            kept.append(utt)
        except AudioError as exc:
            failed.append((utt.utt_id, utt.audio, str(exc)))
    feats = compute_batch(signals, opts, [u.utt_id for u in kept], seed)
    items = []
    for utt, mat, sig in zip(kept, feats, signals):
        if mat.shape[0] == 0:
            failed.append((utt.utt_id, utt.audio, f"{sig.size} samples: shorter than one frame"))
        else:
            items.append((utt.utt_id, mat))
    encoded = [(k, matrix_bytes(m, compress)) for k, m in items]
    stored = [decoded(e) for _, e in encoded] if compress else [m for _, m in items]
    scp = write_ark(ark, encoded)
    return ShardResult(
        scp=scp,
        num_frames={k: int(m.shape[0]) for k, m in items},
        stats=np.stack([cmvn_stats(m) for m in stored]) if items else np.zeros((0, 2, opts.dim + 1)),
        failed=failed,
        audio_seconds=float(sum(s.size for s in signals) / opts.sample_rate),
        seconds=time.perf_counter() - start,
    )


@dataclass
class FeatureSummary:
    """Counts and timing of one features run."""

    kind: str
    dim: int
    utterances: int
    frames: int
    failed: int
    shards: int
    audio_hours: float
    wall_seconds: float
    compute_seconds: float
    workers: int
    task_seconds: float = 0.0  # sum over shards of the time spent inside the task (read+compute+write)

    @property
    def x_real_time(self) -> float:
        return self.audio_hours * 3600.0 / self.wall_seconds if self.wall_seconds else 0.0


def write_splits(out: Path, data_dir: Path, splits: list[str], stats: Path, shape: tuple[int, int]) -> None:
    """Per split: its subset of the index (``out``'s ``feats.scp`` and ``utt2num_frames``, in key order) and per-speaker
    CMVN statistics, each split's ``utt2spk`` joined with the index a line at a time.

    ``stats`` is a file of one row of CMVN statistics (float64, ``shape``) per line of ``out/feats.scp``, in its
    order, read a row at a time (a split's rows come in increasing order).
    """
    size = 8 * shape[0] * shape[1]
    for split in splits:
        index = lookup(_indexed(out))
        folder = out / split
        folder.mkdir(parents=True, exist_ok=True)
        totals: dict[str, np.ndarray] = {}
        with atomic_text(folder / "feats.scp") as scp, atomic_text(folder / "utt2num_frames") as lengths, \
                open(stats, "rb") as rows:
            for utt, spk in ordered_rows(data_dir / split / "utt2spk"):
                hit = index(utt)
                if hit is None:
                    continue
                location, frames, row = hit
                scp.write(f"{utt} {location}\n")
                lengths.write(f"{utt} {frames}\n")
                rows.seek(row * size)
                value = np.frombuffer(rows.read(size), dtype=np.float64).reshape(shape)
                if spk in totals:
                    totals[spk] += value
                else:
                    totals[spk] = value.copy()
        write_text_atomic(folder / "cmvn.scp", write_ark(folder / "cmvn.ark", sorted(totals.items())))


def _indexed(out: Path) -> Iterator[tuple[str, tuple[str, str, int]]]:
    """``(utt, (ark:offset, frames, row))`` of every line of ``out``'s ``feats.scp`` and ``utt2num_frames``."""
    for row, ((utt, location), (_, frames)) in enumerate(zip(entries(out / "feats.scp"),
                                                             entries(out / "utt2num_frames"), strict=True)):
        yield utt, (location, frames, row)


def stage_utterances(data_dir: Path, splits: list[str]) -> Iterator[Utterance]:
    """Every utterance to extract, once and in id order: the ``all`` dir's merged, as they are read, with the
    speed-perturbed copies that splits hold (those with ``utt2speed``)."""
    streams = [iter_data_dir(data_dir / "all")]
    streams += [iter_data_dir(data_dir / s) for s in splits if (data_dir / s / "utt2speed").is_file()]
    last = None
    for utt in heapq.merge(*streams, key=lambda u: u.utt_id):
        if utt.utt_id != last:
            last = utt.utt_id
            yield utt


def extract_features(config: dict[str, Any], data_dir: str | Path, kind: str, out_dir: str | Path,
                     client: Any, workers: int = 1, log=print) -> FeatureSummary:
    """Run the features stage for one ``kind`` (``mfcc`` or ``fbank``).

    The utterances stream from the data dirs through the cluster (a few shards at a time), and each shard's
    index lines and CMVN statistics are written as its result comes, so the driver's memory does not grow
    with the corpus."""
    start = time.perf_counter()
    data_dir, out = Path(data_dir), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fcfg = config["features"]
    opts = FeatureOptions.from_config(fcfg, kind, config["audio"]["sample_rate"])
    manifest = json.loads((data_dir / "manifest.json").read_text(encoding="utf-8"))
    splits = list(manifest["splits"])
    log(f"{kind}: shards of {fcfg['shard_utts']} utterances, dim {opts.dim}")
    items = ((group, str(out / f"feats.{i:04d}.ark"))
             for i, group in enumerate(chunks(stage_utterances(data_dir, splits), fcfg["shard_utts"])))
    stats_path = out / ".cmvn_stats.tmp"
    shards = utterances = frames = 0
    audio_seconds = task_seconds = 0.0
    failed: list[tuple[str, str, str]] = []
    with atomic_text(out / "feats.scp") as scp, atomic_text(out / "utt2num_frames") as lengths, \
            open(stats_path, "wb") as stats_file:
        for result in stream_sharded(client, _extract_shard_args, items, opts, config["seed"], fcfg["compress"],
                                     units=lambda item: len(item[0]), desc=f"features-{kind}",
                                     retries=config["dask"]["retries"]):
            scp.writelines(f"{line}\n" for line in result.scp)
            lengths.writelines(f"{u} {n}\n" for u, n in result.num_frames.items())
            stats_file.write(np.ascontiguousarray(result.stats, dtype=np.float64).tobytes())
            shards += 1
            utterances += len(result.num_frames)
            frames += sum(result.num_frames.values())
            failed += result.failed
            audio_seconds += result.audio_seconds
            task_seconds += result.seconds
    compute_end = time.perf_counter()
    for stale in out.glob(".feats.*.tmp"):  # left by a worker killed mid-write (its shard was redone)
        stale.unlink()
    write_text_atomic(out / "report.tsv", ["utt_id\tfile\treason", *("\t".join(f) for f in sorted(failed))])
    write_splits(out, data_dir, splits, stats_path, (2, opts.dim + 1))
    stats_path.unlink()
    summary = FeatureSummary(
        kind=kind, dim=opts.dim, utterances=utterances, frames=frames, failed=len(failed), shards=shards,
        audio_hours=audio_seconds / 3600.0, wall_seconds=time.perf_counter() - start,
        compute_seconds=compute_end - start, workers=workers, task_seconds=task_seconds,
    )
    (out / "manifest.json").write_text(json.dumps(
        {"kind": kind, "dim": opts.dim, "options": asdict(opts), "utterances": summary.utterances,
         "frames": summary.frames, "failed": summary.failed, "shards": summary.shards, "splits": splits},
        indent=2) + "\n", encoding="utf-8")
    (out / "timing.json").write_text(json.dumps(
        {**asdict(summary), "x_real_time": summary.x_real_time}, indent=2) + "\n", encoding="utf-8")
    log(f"{kind}: {summary.utterances} utterances in {shards} shards, {summary.frames} frames, "
        f"{summary.failed} failed, {summary.x_real_time:.0f}x real time")
    return summary


def _extract_shard_args(item: tuple[list[Utterance], str], opts: FeatureOptions, seed: int,
                        compress: bool) -> ShardResult:
    utts, ark = item
    return extract_shard(utts, opts, seed, ark, compress)
