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

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from asrflow.cluster import run_sharded, shard
from asrflow.data.audio import AudioError, read_audio
from asrflow.data.datadir import read_data_dir, read_table
from asrflow.data.perturb import perturb_speed
from asrflow.data.validate import Utterance
from asrflow.features.ark import decoded, matrix_bytes, write_ark, write_text_atomic
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


def speaker_cmvn(ids: list[str], utt2spk: dict[str, str], row: dict[str, int],
                 stats: np.ndarray) -> list[tuple[str, np.ndarray]]:
    """Sum per-utterance CMVN statistics (``stats[row[utt]]``) per speaker, sorted by speaker."""
    speakers, inverse = np.unique([utt2spk[u] for u in ids], return_inverse=True)
    totals = np.zeros((len(speakers), *stats.shape[1:]), dtype=np.float64)
    np.add.at(totals, inverse, stats[[row[u] for u in ids]])
    return list(zip(speakers.tolist(), totals))


def write_splits(out: Path, data_dir: Path, splits: list[str], scp_of: dict[str, str],
                 frames: dict[str, int], stats: np.ndarray) -> None:
    """Per split: its subset of the index and per-speaker CMVN statistics.

    ``stats`` holds one row of CMVN statistics per utterance, in ``scp_of`` order.
    """
    row = {utt: i for i, utt in enumerate(scp_of)}
    for split in splits:
        utt2spk = read_table(data_dir / split / "utt2spk")
        ids = [u for u in utt2spk if u in row]
        folder = out / split
        folder.mkdir(parents=True, exist_ok=True)
        write_text_atomic(folder / "feats.scp", [f"{u} {scp_of[u]}" for u in ids])
        write_text_atomic(folder / "utt2num_frames", [f"{u} {frames[u]}" for u in ids])
        cmvn_lines = write_ark(folder / "cmvn.ark", speaker_cmvn(ids, utt2spk, row, stats) if ids else [])
        write_text_atomic(folder / "cmvn.scp", cmvn_lines)


def stage_utterances(data_dir: Path, splits: list[str]) -> list[Utterance]:
    """Every utterance to extract: the ``all`` dir's, then those only some split holds (speed-perturbed copies)."""
    utts = read_data_dir(data_dir / "all")
    known = {u.utt_id for u in utts}
    for split in splits:
        extra = [u for u in read_data_dir(data_dir / split) if u.utt_id not in known]
        known.update(u.utt_id for u in extra)
        utts += extra
    return utts


def extract_features(config: dict[str, Any], data_dir: str | Path, kind: str, out_dir: str | Path,
                     client: Any, workers: int = 1, log=print) -> FeatureSummary:
    """Run the features stage for one ``kind`` (``mfcc`` or ``fbank``)."""
    start = time.perf_counter()
    data_dir, out = Path(data_dir), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fcfg = config["features"]
    opts = FeatureOptions.from_config(fcfg, kind, config["audio"]["sample_rate"])
    manifest = json.loads((data_dir / "manifest.json").read_text(encoding="utf-8"))
    splits = list(manifest["splits"])
    utts = stage_utterances(data_dir, splits)
    shards = shard(utts, fcfg["shard_utts"])
    arks = [str(out / f"feats.{i:04d}.ark") for i in range(len(shards))]
    log(f"{kind}: {len(utts)} utterances in {len(shards)} shards, dim {opts.dim}")
    results = run_sharded(client, _extract_shard_args, list(zip(shards, arks)), opts, config["seed"],
                          config["features"]["compress"],
                          units=[len(s) for s in shards], desc=f"features-{kind}",
                          retries=config["dask"]["retries"])
    compute_end = time.perf_counter()
    for stale in out.glob(".feats.*.tmp"):  # left by a worker killed mid-write (its shard was redone)
        stale.unlink()
    scp_lines = [line for r in results for line in r.scp]
    frames = {k: v for r in results for k, v in r.num_frames.items()}
    stats = np.concatenate([r.stats for r in results])
    failed = sorted(f for r in results for f in r.failed)
    write_text_atomic(out / "feats.scp", scp_lines)
    write_text_atomic(out / "utt2num_frames", (f"{u} {n}" for u, n in frames.items()))
    write_text_atomic(out / "report.tsv", ["utt_id\tfile\treason", *("\t".join(f) for f in failed)])
    scp_of = dict(line.split(" ", 1) for line in scp_lines)
    write_splits(out, data_dir, splits, scp_of, frames, stats)
    summary = FeatureSummary(
        kind=kind, dim=opts.dim, utterances=len(frames), frames=sum(frames.values()), failed=len(failed),
        shards=len(shards), audio_hours=sum(r.audio_seconds for r in results) / 3600.0,
        wall_seconds=time.perf_counter() - start, compute_seconds=compute_end - start, workers=workers,
        task_seconds=sum(r.seconds for r in results),
    )
    (out / "manifest.json").write_text(json.dumps(
        {"kind": kind, "dim": opts.dim, "options": asdict(opts), "utterances": summary.utterances,
         "frames": summary.frames, "failed": summary.failed, "shards": summary.shards, "splits": splits},
        indent=2) + "\n", encoding="utf-8")
    (out / "timing.json").write_text(json.dumps(
        {**asdict(summary), "x_real_time": summary.x_real_time}, indent=2) + "\n", encoding="utf-8")
    log(f"{kind}: {summary.utterances} utterances, {summary.frames} frames, {summary.failed} failed, "
        f"{summary.x_real_time:.0f}x real time")
    return summary


def _extract_shard_args(item: tuple[list[Utterance], str], opts: FeatureOptions, seed: int,
                        compress: bool) -> ShardResult:
    utts, ark = item
    return extract_shard(utts, opts, seed, ark, compress)
