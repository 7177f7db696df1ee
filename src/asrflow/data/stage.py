"""The data stage: list a corpus, validate every utterance on Dask, write Kaldi data dirs.

Output folder::

    all/            every valid utterance (features are computed once over it)
    <split>/        one Kaldi data dir per split (train, test, loso_<spk>_train, ...)
    <train>_sp/     with audio.speed_perturb: a training split and its speed-perturbed copies
    report.tsv      rejected utterances: utt_id, file, reason
    manifest.json   counts, hours, rejections by reason, splits, corpus fingerprint
"""

from __future__ import annotations

import csv
import hashlib
import json
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from asrflow.cluster import run_sharded, shard
from asrflow.corpus import CorpusError, recipe_from_config
from asrflow.data.datadir import write_data_dir
from asrflow.data.perturb import copy_factors, perturbed_split, with_copies
from asrflow.data.validate import Rejection, Utterance, check_audio_batch, check_text

SHARD_UTTS = 200


@dataclass
class DataSummary:
    """What the data stage did (written to manifest.json and logged to MLflow)."""

    corpus: str
    utterances: int
    hours: float
    rejected: int
    rejected_by_reason: dict[str, int]
    splits: dict[str, dict[str, float]]
    fingerprint: str
    wall_seconds: float = 0.0
    sample_rates: dict[str, int] = field(default_factory=dict)

    @property
    def x_real_time(self) -> float:
        return self.hours * 3600.0 / self.wall_seconds if self.wall_seconds else 0.0


def fingerprint(utterances: list[Utterance]) -> str:
    """sha256 over (id, audio checksum, normalised text) of every valid utterance."""
    h = hashlib.sha256()
    for u in sorted(utterances, key=lambda u: u.utt_id):
        h.update(f"{u.utt_id}\t{u.checksum}\t{u.text}\n".encode())
    return h.hexdigest()


def _reason_kind(reason: str) -> str:
    """Group reasons for counting ("duration 0.05 s is below ..." → "duration below")."""
    head = reason.split(":")[0]
    for word in ("below", "above"):
        if word in head:
            return f"duration {word} bounds"
    if head.startswith("line ") and "UTF-8" in head:
        return "not valid UTF-8"
    if head.startswith("duplicate"):
        return "duplicate utterance id"
    return head


def write_report(path: Path, rejected: list[Rejection]) -> None:
    """Write the rejection report as TSV (utt_id, file, reason)."""
    with open(path, "w", encoding="utf-8", newline="") as out:
        writer = csv.writer(out, delimiter="\t", lineterminator="\n")
        writer.writerow(["utt_id", "file", "reason"])
        for r in sorted(rejected, key=lambda r: (r.utt_id, r.reason)):
            writer.writerow([r.utt_id, r.file, r.reason])


def _split_stats(members: list[Utterance]) -> dict[str, Any]:
    return {"utterances": len(members), "speakers": len({u.speaker for u in members}),
            "hours": round(sum(u.duration for u in members) / 3600.0, 6)}


def prepare_data(config: dict[str, Any], out_dir: str | Path, client: Any, log=print) -> DataSummary:
    """Run the data stage for the resolved ``config`` into ``out_dir`` using a Dask ``client``."""
    start = time.perf_counter()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    recipe = recipe_from_config(config["corpus"])
    listing = recipe.list_utterances()
    log(f"{recipe.name}: {len(listing.utterances)} utterances listed")
    texts, rejected = check_text(listing.utterances, config["corpus"]["language"])
    candidates, taken = [], set()
    for raw in listing.utterances:
        if raw.utt_id in texts and raw.utt_id not in taken:
            taken.add(raw.utt_id)
            candidates.append(raw)
    audio = config["audio"]
    shards = shard(candidates, SHARD_UTTS)
    checks = run_sharded(client, check_audio_batch, shards, audio["min_duration"], audio["max_duration"],
                         units=[len(s) for s in shards], desc="validate",
                         retries=config["dask"]["retries"])
    valid: list[Utterance] = []
    for raw, check in zip(candidates, (c for batch in checks for c in batch)):
        if not check.ok:
            rejected.append(Rejection(raw.utt_id, raw.audio, check.reason))
            continue
        valid.append(Utterance(raw.utt_id, raw.speaker, raw.audio, texts[raw.utt_id], check.duration,
                               check.sample_rate, raw.recording_id, raw.start, raw.end, check.checksum))
    if not valid:
        write_report(out / "report.tsv", rejected)
        raise CorpusError(f"no utterance of {recipe.name} survived validation; see {out / 'report.tsv'}")
    write_data_dir(out / "all", valid)
    by_id = {u.utt_id: u for u in valid}
    splits = recipe.splits({u.utt_id: u.speaker for u in valid})
    split_stats = {}
    for name, ids in splits.items():
        members = [by_id[i] for i in ids]
        write_data_dir(out / name, members)
        split_stats[name] = _split_stats(members)
        log(f"  split {name}: {len(members)} utterances")
    factors = copy_factors(audio["speed_perturb"])
    for name in [n for n in splits if n.endswith("train") and factors]:
        members = with_copies((by_id[i] for i in splits[name]), factors)
        write_data_dir(out / perturbed_split(name), members)
        split_stats[perturbed_split(name)] = _split_stats(members)
        log(f"  split {perturbed_split(name)}: {len(members)} utterances (speeds 1, {', '.join(map(str, factors))})")
    write_report(out / "report.tsv", rejected)
    summary = DataSummary(
        corpus=recipe.name,
        utterances=len(valid),
        hours=round(sum(u.duration for u in valid) / 3600.0, 6),
        rejected=len(rejected),
        rejected_by_reason=dict(sorted(Counter(_reason_kind(r.reason) for r in rejected).items())),
        splits=split_stats,
        fingerprint=fingerprint(valid),
        sample_rates={str(k): v for k, v in sorted(Counter(u.sample_rate for u in valid).items())},
    )
    summary.wall_seconds = round(time.perf_counter() - start, 3)
    manifest = {k: v for k, v in asdict(summary).items() if k != "wall_seconds"}  # deterministic
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    log(f"{summary.utterances} valid utterances ({summary.hours:.3f} h), {summary.rejected} rejected")
    return summary
