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
import heapq
import json
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import asdict, astuple, dataclass, field
from pathlib import Path
from typing import Any

from asrflow.cluster import chunks, stream_sharded
from asrflow.corpus import CorpusError, Recipe, recipe_from_config
from asrflow.corpus.base import RawUtterance
from asrflow.data.datadir import DataDirWriter, iter_data_dir
from asrflow.data.perturb import copy_factors, perturbed_split, speed_copy
from asrflow.data.tables import ExternalSort, atomic_text
from asrflow.data.validate import Rejection, Utterance, text_problem, validate_batch

SHARD_UTTS = 200
SORT_LINES = 20_000  # valid utterances the on-disk sort keeps in memory before it writes a sorted run


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


def _record(utt: Utterance, split: str | None) -> str:
    """A valid utterance and its recipe's split as one line (JSON) for the on-disk sort."""
    return json.dumps([*astuple(utt), split], ensure_ascii=False)


def _from_record(line: str) -> tuple[Utterance, str | None]:
    *fields, split = json.loads(line)
    return Utterance(*fields), split


@dataclass
class _Listed:
    """What the validation of one corpus found: its recipe, counts, its splits in the order listed, speakers."""

    recipe: Recipe
    listed: int = 0
    valid: int = 0
    splits: list[str] = field(default_factory=list)
    speakers: set[str] = field(default_factory=set)


def _validated(corpus: dict[str, Any], config: dict[str, Any], client: Any, tag: str, valid: ExternalSort,
               rejected: list[Rejection], log=print, speakers: dict[str, dict[str, str]] | None = None) -> _Listed:
    """List corpus ``corpus`` (a resolved corpus section) as its recipe streams it, check each transcript on the
    driver and the audio on Dask, a few shards at a time; the valid utterances (their ``corpus`` field set to
    ``tag``) go to the sort ``valid``, the rejections to ``rejected``. What the recipe knows of its speakers
    (``Listing.speakers``) is added to ``speakers``."""
    found = _Listed(recipe_from_config(corpus))
    listing = found.recipe.list_utterances()
    if speakers is not None:
        for attribute, table in listing.speakers.items():
            speakers.setdefault(attribute, {}).update(table)

    def candidates() -> Iterator[tuple[RawUtterance, str]]:
        for raw in listing.utterances:
            found.listed += 1
            if raw.split is not None and raw.split not in found.splits:
                found.splits.append(raw.split)
            text, problem = text_problem(raw, corpus["language"])
            if text is None:
                rejected.append(Rejection(raw.utt_id, raw.audio, problem))
            else:
                yield raw, text

    audio = config["audio"]
    for batch in stream_sharded(client, validate_batch, chunks(candidates(), SHARD_UTTS), audio["min_duration"],
                                audio["max_duration"], tag, desc="validate", retries=config["dask"]["retries"]):
        for item in batch:
            if isinstance(item, Rejection):
                rejected.append(item)
                continue
            utt, split = item
            valid.add(utt.utt_id, _record(utt, split))
            found.valid += 1
            if not tag:
                found.speakers.add(utt.speaker)
    log(f"{found.recipe.name}{f' ({tag})' if tag else ''}: {found.listed} utterances listed, {found.valid} with "
        "valid audio")
    return found


def extra_tags(extras: list[dict[str, Any]]) -> list[str]:
    """A name per ``corpus.extra_training`` entry: ``<recipe>_<language>``, numbered when repeated."""
    tags: list[str] = []
    for extra in extras:
        tag = f"{extra['name']}_{extra['language']}"
        tags.append(tag if tag not in tags else f"{tag}_{len(tags) + 1}")
    return tags


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

    The corpus streams from its recipe through validation into an on-disk sort (Kaldi's ``sort``), and the
    sorted utterances stream into the data dirs, so the driver's memory does not grow with the corpus (the
    splits of a recipe that only assigns them once it has every id, :meth:`Recipe.splits`, take a table of
    ids). ``kept_report``: a second copy of ``report.tsv`` outside ``out_dir``, which a workflow manager that
    removes the outputs of a failed job leaves in place, so the user can read why utterances were rejected.
    """
    start = time.perf_counter()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    speakers: dict[str, dict[str, str]] = {}  # spk2gender, spk2age, ... of every corpus
    rejected: list[Rejection] = []
    sort = ExternalSort(out / ".sort", SORT_LINES)
    own = _validated(config["corpus"], config, client, "", sort, rejected, log, speakers)
    if not own.valid:
        where = _write_reports(rejected, out, kept_report)
        raise CorpusError(f"no utterance of {own.recipe.name} survived validation ({len(rejected)} rejected); the "
                          f"reasons are in {where}")
    unperturbed: set[str] = set()  # extra corpora without speed-perturbed copies
    extra_rejected: Counter[str] = Counter()
    for corpus, tag in zip(config["corpus"]["extra_training"], extra_tags(config["corpus"]["extra_training"])):
        before = len(rejected)
        _validated(corpus, config, client, tag, sort, rejected, log, speakers)
        extra_rejected[tag] += len(rejected) - before
        if not corpus["speed_perturb"]:
            unperturbed.add(tag)
    merged = _write_all(sort.merged(), out, speakers, own.speakers, rejected, extra_rejected)
    names = own.splits or list(own.recipe.splits(merged.untagged))
    members = None if own.splits else own.recipe.splits(merged.untagged)
    split_stats = {}
    for name in names:
        chosen = None if members is None else set(members[name])
        split_stats[name] = _write_split(out, name, speakers, chosen)
        log(f"  split {name}: {split_stats[name]['utterances']} utterances")
    factors = copy_factors(config["audio"]["speed_perturb"])
    for name in [n for n in names if is_training_split(n) and factors]:
        split_stats[perturbed_split(name)] = _write_perturbed(out, name, speakers, factors, unperturbed)
        log(f"  split {perturbed_split(name)}: {split_stats[perturbed_split(name)]['utterances']} utterances "
            f"(speeds 1, {', '.join(map(str, factors))})")
    (out / ".valid.jsonl").unlink()
    if (out / ".sort").is_dir():
        (out / ".sort").rmdir()
    for tag, stats in merged.extras.items():
        log(f"  extra training corpus {tag}: {stats['utterances']} utterances join every training split")
    _write_reports(rejected, out, kept_report)
    summary = DataSummary(
        corpus=own.recipe.name,
        utterances=int(merged.every["utterances"]),
        hours=merged.every["hours"],
        rejected=len(rejected),
        rejected_by_reason=dict(sorted(Counter(_reason_kind(r.reason) for r in rejected).items())),
        splits=split_stats,
        fingerprint=merged.fingerprint,
        sample_rates={str(k): v for k, v in sorted(merged.rates.items())},
        extra_training={tag: {**stats, "rejected": extra_rejected[tag]} for tag, stats in merged.extras.items()},
    )
    summary.wall_seconds = round(time.perf_counter() - start, 3)
    manifest = {k: v for k, v in asdict(summary).items()  # deterministic; as before extra corpora when none
                if k != "wall_seconds" and (k != "extra_training" or v)}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    log(f"{summary.utterances} valid utterances ({summary.hours:.3f} h), {summary.rejected} rejected")
    return summary


@dataclass
class _Merged:
    """What writing ``all`` found: its counts, fingerprint and sample rates, each extra corpus's counts, and the
    speakers of the own utterances whose recipe gave no split (for :meth:`Recipe.splits`)."""

    every: dict[str, float]
    fingerprint: str
    rates: Counter[int]
    extras: dict[str, dict[str, Any]]
    untagged: dict[str, str]


def _write_all(records: Iterator[tuple[str, str]], out: Path, speakers: dict[str, dict[str, str]],
               own_speakers: set[str], rejected: list[Rejection], extra_rejected: Counter[str]) -> _Merged:
    """``all/`` (every valid utterance) and ``.valid.jsonl`` (the same, with splits) from the sorted records: an id
    listed twice keeps its first listing, an extra corpus's utterance of a speaker id the experiment's corpus
    has is rejected (one id for two speakers would pool their CMVN and fMLLR)."""
    digest = hashlib.sha256()  # the corpus fingerprint: (id, audio checksum, normalised text) of each, in id order
    rates: Counter[int] = Counter()
    extras: dict[str, dict[str, Any]] = {}
    extra_speakers: dict[str, set[str]] = {}
    untagged: dict[str, str] = {}
    last: Utterance | None = None
    with DataDirWriter(out / "all", speakers) as every, atomic_text(out / ".valid.jsonl") as kept:
        for _, line in records:
            utt, split = _from_record(line)
            reason = ""
            if last is not None and utt.utt_id == last.utt_id:
                reason = (f"duplicate utterance id (first: {last.audio})" if utt.corpus == last.corpus else
                          f"duplicate utterance id (corpus.extra_training {utt.corpus} repeats an id another corpus "
                          "has)")
            elif utt.corpus and utt.speaker in own_speakers:
                reason = (f"duplicate speaker id {utt.speaker} (corpus.extra_training {utt.corpus} has a speaker of "
                          "the experiment's corpus)")
            if reason:
                rejected.append(Rejection(utt.utt_id, utt.audio, reason))
                extra_rejected[utt.corpus] += bool(utt.corpus)
                continue
            last = utt
            every.add(utt)
            kept.write(line + "\n")
            digest.update(f"{utt.utt_id}\t{utt.checksum}\t{utt.text}\n".encode())
            rates[utt.sample_rate] += 1
            if utt.corpus:
                stats = extras.setdefault(utt.corpus, {"utterances": 0, "speakers": 0, "hours": 0.0})
                stats["utterances"] += 1
                stats["hours"] += utt.duration / 3600.0
                extra_speakers.setdefault(utt.corpus, set()).add(utt.speaker)
            elif split is None:
                untagged[utt.utt_id] = utt.speaker
    for tag, stats in extras.items():
        stats.update(speakers=len(extra_speakers[tag]), hours=round(stats["hours"], 6))
    return _Merged(every.stats, digest.hexdigest(), rates, extras, untagged)


def _valid(out: Path) -> Iterator[tuple[Utterance, str | None]]:
    """The utterances of ``all`` with their recipe's split, from ``.valid.jsonl``, a line at a time."""
    with open(out / ".valid.jsonl", encoding="utf-8") as lines:
        for line in lines:
            yield _from_record(line)


def _write_split(out: Path, name: str, speakers: dict[str, dict[str, str]],
                 chosen: set[str] | None) -> dict[str, float]:
    """Split ``name``'s data dir: the own utterances the recipe put in it (their split, or ``chosen``), and every
    extra corpus's utterance if it is a training split; its counts."""
    training = is_training_split(name)
    with DataDirWriter(out / name, speakers) as writer:
        for utt, split in _valid(out):
            if (training if utt.corpus else (utt.utt_id in chosen if chosen is not None else split == name)):
                writer.add(utt)
    return writer.stats


def _write_perturbed(out: Path, name: str, speakers: dict[str, dict[str, str]], factors: list[float],
                     unperturbed: set[str]) -> dict[str, float]:
    """``<name>_sp``: split ``name``'s utterances and their speed-perturbed copies (none of the extra corpora in
    ``unperturbed``), merged in id order as the split is read; its counts."""
    copies = [_copies(out / name, f, unperturbed) for f in factors]
    with DataDirWriter(out / perturbed_split(name), speakers) as writer:
        for utt in heapq.merge(iter_data_dir(out / name), *copies, key=lambda u: u.utt_id):
            writer.add(utt)
    return writer.stats


def _copies(folder: Path, factor: float, unperturbed: set[str]) -> Iterator[Utterance]:
    """The copies at ``factor`` of a data dir's utterances (not of the extra corpora in ``unperturbed``)."""
    for utt in iter_data_dir(folder):
        if utt.corpus not in unperturbed:
            yield speed_copy(utt, factor)
