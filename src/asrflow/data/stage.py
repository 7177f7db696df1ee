"""The data stage: list a corpus, validate every utterance on Dask, write Kaldi data dirs.

The corpora of ``corpus.extra_training`` are listed and validated the same way; their
utterances join every training split (and ``all``), marked in ``utt2corpus``.

Output folder::

    all/            every valid utterance (features are computed once over it)
    <split>/        one Kaldi data dir per split (train, test, loso_<spk>_train, ...)
    <train>_sp/     with audio.speed_perturb: a training split and its speed-perturbed copies
    report.tsv      rejected utterances: utt_id, file, reason
    manifest.json   counts, hours, rejections by reason, splits, corpus fingerprint, extra corpora
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
from asrflow.corpus import CorpusError, Recipe, recipe_from_config
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
    extra_training: dict[str, dict[str, Any]] = field(default_factory=dict)  # corpus.extra_training, by tag

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
    if head.startswith("duplicate speaker"):
        return "duplicate speaker id"
    if head.startswith("duplicate"):
        return "duplicate utterance id"
    return head


def reason_counts(report: Path) -> dict[str, int]:
    """Rejected utterances per kind of reason in a written ``report.tsv``."""
    with open(report, encoding="utf-8", newline="") as rows:
        reasons = [row["reason"] for row in csv.DictReader(rows, delimiter="\t")]
    return dict(sorted(Counter(_reason_kind(r) for r in reasons).items()))


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


def _validated(corpus: dict[str, Any], config: dict[str, Any], client: Any, tag: str, log=print,
               speakers: dict[str, dict[str, str]] | None = None) -> tuple[Recipe, list[Utterance], list[Rejection]]:
    """List corpus ``corpus`` (a resolved corpus section), check its text and audio on Dask; returns its
    recipe, the valid utterances (their ``corpus`` field set to ``tag``) and the rejections. What the recipe
    knows of its speakers (``Listing.speakers``) is added to ``speakers``."""
    recipe = recipe_from_config(corpus)
    listing = recipe.list_utterances()
    if speakers is not None:
        for attribute, table in listing.speakers.items():
            speakers.setdefault(attribute, {}).update(table)
    log(f"{recipe.name}{f' ({tag})' if tag else ''}: {len(listing.utterances)} utterances listed")
    texts, rejected = check_text(listing.utterances, corpus["language"])
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
                               check.sample_rate, raw.recording_id, raw.start, raw.end, check.checksum, corpus=tag))
    return recipe, valid, rejected


def extra_tags(extras: list[dict[str, Any]]) -> list[str]:
    """A name per ``corpus.extra_training`` entry: ``<recipe>_<language>``, numbered when repeated."""
    tags: list[str] = []
    for extra in extras:
        tag = f"{extra['name']}_{extra['language']}"
        tags.append(tag if tag not in tags else f"{tag}_{len(tags) + 1}")
    return tags


def _without_clashes(own: list[Utterance], extra: list[Utterance]) -> tuple[list[Utterance], list[Rejection]]:
    """``extra`` less the utterances whose id an earlier corpus already has, or whose speaker id the
    experiment's own corpus has (rejected: one id for two speakers would pool their CMVN and fMLLR)."""
    seen = {u.utt_id for u in own}
    speakers = {u.speaker for u in own if not u.corpus}
    kept, rejected = [], []
    for u in extra:
        if u.utt_id in seen:
            rejected.append(Rejection(u.utt_id, u.audio, f"duplicate utterance id (corpus.extra_training {u.corpus} "
                                                         "repeats an id another corpus has)"))
            continue
        if u.speaker in speakers:
            rejected.append(Rejection(u.utt_id, u.audio, f"duplicate speaker id {u.speaker} (corpus.extra_training "
                                                         f"{u.corpus} has a speaker of the experiment's corpus)"))
            continue
        seen.add(u.utt_id)
        kept.append(u)
    return kept, rejected


def _write_reports(rejected: list[Rejection], out: Path, kept: str | Path | None) -> Path:
    """``out/report.tsv`` and its copy ``kept`` (when given); the path the user should read."""
    write_report(out / "report.tsv", rejected)
    if kept is None:
        return out / "report.tsv"
    Path(kept).parent.mkdir(parents=True, exist_ok=True)
    write_report(Path(kept), rejected)
    return Path(kept)


def is_training_split(name: str) -> bool:
    """Whether split ``name`` is one that acoustic models train on (``train``, ``loso_<spk>_train``)."""
    return name.endswith("train")


def prepare_data(config: dict[str, Any], out_dir: str | Path, client: Any, log=print,
                 kept_report: str | Path | None = None) -> DataSummary:
    """Run the data stage for the resolved ``config`` into ``out_dir`` using a Dask ``client``.

    ``kept_report``: a second copy of ``report.tsv`` outside ``out_dir``, which a workflow manager that
    removes the outputs of a failed job leaves in place, so the user can read why utterances were rejected.
    """
    start = time.perf_counter()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    audio = config["audio"]
    speakers: dict[str, dict[str, str]] = {}  # spk2gender, spk2age, ... of every corpus
    recipe, valid, rejected = _validated(config["corpus"], config, client, "", log, speakers)
    if not valid:
        where = _write_reports(rejected, out, kept_report)
        raise CorpusError(f"no utterance of {recipe.name} survived validation ({len(rejected)} rejected); the "
                          f"reasons are in {where}")
    extras: list[Utterance] = []
    unperturbed: set[str] = set()  # extra utterances without speed-perturbed copies
    extra_stats: dict[str, dict[str, Any]] = {}
    for corpus, tag in zip(config["corpus"]["extra_training"], extra_tags(config["corpus"]["extra_training"])):
        _, found, dropped = _validated(corpus, config, client, tag, log, speakers)
        found, duplicates = _without_clashes(valid + extras, found)
        extras += found
        if not corpus["speed_perturb"]:
            unperturbed.update(u.utt_id for u in found)
        rejected += dropped + duplicates
        extra_stats[tag] = {**_split_stats(found), "rejected": len(dropped) + len(duplicates)}
        log(f"  extra training corpus {tag}: {len(found)} utterances join every training split")
    every = valid + extras
    write_data_dir(out / "all", every, speakers)
    by_id = {u.utt_id: u for u in valid}
    splits = recipe.splits({u.utt_id: u.speaker for u in valid})
    split_stats = {}
    for name, ids in splits.items():
        members = [by_id[i] for i in ids] + (extras if is_training_split(name) else [])
        write_data_dir(out / name, members, speakers)
        split_stats[name] = _split_stats(members)
        log(f"  split {name}: {len(members)} utterances")
    factors = copy_factors(audio["speed_perturb"])
    copied = [u for u in extras if u.utt_id not in unperturbed]
    once = [u for u in extras if u.utt_id in unperturbed]
    for name in [n for n in splits if is_training_split(n) and factors]:
        members = with_copies([by_id[i] for i in splits[name]] + copied, factors) + once
        write_data_dir(out / perturbed_split(name), members, speakers)
        split_stats[perturbed_split(name)] = _split_stats(members)
        log(f"  split {perturbed_split(name)}: {len(members)} utterances (speeds 1, {', '.join(map(str, factors))})")
    _write_reports(rejected, out, kept_report)
    summary = DataSummary(
        corpus=recipe.name,
        utterances=len(every),
        hours=round(sum(u.duration for u in every) / 3600.0, 6),
        rejected=len(rejected),
        rejected_by_reason=dict(sorted(Counter(_reason_kind(r.reason) for r in rejected).items())),
        splits=split_stats,
        fingerprint=fingerprint(every),
        sample_rates={str(k): v for k, v in sorted(Counter(u.sample_rate for u in every).items())},
        extra_training=extra_stats,
    )
    summary.wall_seconds = round(time.perf_counter() - start, 3)
    manifest = {k: v for k, v in asdict(summary).items()  # deterministic; as before extra corpora when none
                if k != "wall_seconds" and (k != "extra_training" or v)}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    log(f"{summary.utterances} valid utterances ({summary.hours:.3f} h), {summary.rejected} rejected")
    return summary
