"""The Kaldi data-dir contract: ``wav.scp``, ``text``, ``utt2spk``, ``spk2utt``, ``utt2dur``,
``segments`` (only when utterances are parts of recordings) and ``utt2sr`` (the source
sample rate, so the features stage knows what to resample), ``utt2speed`` (only when some
utterance is a speed-perturbed copy: its factor, see :mod:`asrflow.data.perturb`) and
``utt2corpus`` (only when some utterances come from ``corpus.extra_training``: for each of them,
the corpus it comes from; the others are the experiment's own corpus's).

Files are sorted in C-locale order (Python string order), one ``key value`` per line, UTF-8.
A ``wav.scp`` value is the rest of its line, so paths with spaces or quotes survive.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from asrflow.data.tables import ExternalSort, Unsorted, drain, lookup, optional_lookup, sorted_rows
from asrflow.data.validate import Utterance

FILES = ("wav.scp", "text", "utt2spk", "spk2utt", "utt2dur", "utt2sr")
#: the per-utterance (and wav.scp's per-recording) tables :func:`iter_data_dir` joins
TABLES = ("wav.scp", "text", "utt2spk", "utt2dur", "utt2sr", "segments", "utt2speed", "utt2corpus")


class DataDirError(ValueError):
    """A data dir is missing a file or its files disagree."""


def _write_table(path: Path, rows: Iterable[tuple[str, str]]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8", newline="\n") as out:
        for key, value in rows:
            out.write(f"{key} {value}\n")
    tmp.replace(path)


def write_data_dir(folder: str | Path, utterances: Iterable[Utterance],
                   speakers: dict[str, dict[str, str]] | None = None) -> dict[str, float]:
    """Write a Kaldi data dir for ``utterances`` (sorted by id); ``speakers`` (attribute → speaker → value, e.g.
    ``gender``) become ``spk2<attribute>`` for the speakers the dir has (a speed-perturbed copy's speaker,
    ``sp<f>-<speaker>``, takes its original's value). Returns its counts (:meth:`DataDirWriter.close`)."""
    with DataDirWriter(folder, speakers) as writer:
        for utt in sorted(utterances, key=lambda u: u.utt_id):
            writer.add(utt)
    return writer.stats


class DataDirWriter:
    """A Kaldi data dir written a line at a time from utterances given in increasing id order, so a stage can
    stream a corpus into it: per-utterance tables are written as they come, ``wav.scp`` (by recording) and
    ``spk2utt`` (by speaker) go through an :class:`~asrflow.data.tables.ExternalSort`, and every file is
    renamed into place when the writer closes without an error. ``segments`` is kept only when some
    utterance is a segment, ``utt2speed`` when some is a speed-perturbed copy, ``utt2corpus`` when some comes
    from an extra corpus (a stale one is removed)."""

    PER_UTTERANCE = ("text", "utt2spk", "utt2dur", "utt2sr", "segments", "utt2speed", "utt2corpus")

    def __init__(self, folder: str | Path, speakers: dict[str, dict[str, str]] | None = None) -> None:
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.speakers = speakers or {}
        self.files = {name: open(self._tmp(name), "w", encoding="utf-8", newline="\n")  # noqa: SIM115 (closed by close)
                      for name in self.PER_UTTERANCE}
        scratch = self.folder / ".sort"
        self.recordings, self.spk2utt = ExternalSort(scratch), ExternalSort(scratch)
        self.last = ""
        self.used = {"segments": False, "utt2speed": False, "utt2corpus": False}
        self.stats: dict[str, float] = {"utterances": 0, "speakers": 0, "hours": 0.0}
        self._seconds = 0.0

    def _tmp(self, name: str) -> Path:
        return self.folder / f".{name}.tmp"

    def add(self, u: Utterance) -> None:
        """Write utterance ``u``, whose id must be above the last one's."""
        if u.utt_id <= self.last:
            raise ValueError(f"{self.folder}: utterance {u.utt_id} given after {self.last} (ids must increase)")
        self.last = u.utt_id
        f = self.files
        f["text"].write(f"{u.utt_id} {u.text}\n")
        f["utt2spk"].write(f"{u.utt_id} {u.speaker}\n")
        f["utt2dur"].write(f"{u.utt_id} {u.duration:.4f}\n")
        f["utt2sr"].write(f"{u.utt_id} {u.sample_rate}\n")
        f["segments"].write(f"{u.utt_id} {u.recording} {u.start or 0.0:.3f} {u.end if u.end is not None else -1}\n")
        f["utt2speed"].write(f"{u.utt_id} {u.speed:g}\n")
        if u.corpus:
            f["utt2corpus"].write(f"{u.utt_id} {u.corpus}\n")
        self.used["segments"] |= u.start is not None
        self.used["utt2speed"] |= u.speed != 1.0
        self.used["utt2corpus"] |= bool(u.corpus)
        self.recordings.add(u.recording, u.audio)
        self.spk2utt.add(u.speaker, u.utt_id)
        self.stats["utterances"] += 1
        self._seconds += u.duration

    def close(self, ok: bool = True) -> None:
        """Write ``wav.scp``, ``spk2utt`` and ``spk2<attribute>`` and put every file in place (``ok``), or remove
        what was written (not ``ok``)."""
        for handle in self.files.values():
            handle.close()
        if not ok:
            for name in self.PER_UTTERANCE:
                self._tmp(name).unlink(missing_ok=True)
            for sort in (self.recordings, self.spk2utt):
                sort.discard()
            return
        last = None
        with open(self._tmp("wav.scp"), "w", encoding="utf-8", newline="\n") as wav:
            for rec, audio in self.recordings.merged():
                if rec != last:
                    wav.write(f"{rec} {audio}\n")
                    last = rec
        speakers = self._write_spk2utt()
        self._write_speaker_attributes(speakers)
        for name in ("wav.scp", "spk2utt", *self.PER_UTTERANCE):
            if self.used.get(name, True):
                self._tmp(name).replace(self.folder / name)
            else:
                self._tmp(name).unlink()
                (self.folder / name).unlink(missing_ok=True)
        self.stats.update(speakers=len(speakers), hours=round(self._seconds / 3600.0, 6))
        if (self.folder / ".sort").is_dir():
            (self.folder / ".sort").rmdir()

    def _write_spk2utt(self) -> list[str]:
        speakers: list[str] = []
        with open(self._tmp("spk2utt"), "w", encoding="utf-8", newline="\n") as out:
            for spk, group in itertools.groupby(self.spk2utt.merged(), key=lambda item: item[0]):
                out.write(f"{spk} {' '.join(utt for _, utt in group)}\n")
                speakers.append(spk)
        return speakers

    def _write_speaker_attributes(self, speakers: list[str]) -> None:
        """``spk2<attribute>`` for each attribute some of ``speakers`` have; a stale one is removed."""
        for attribute, table in self.speakers.items():
            rows = [(s, table.get(s, table.get(re.sub(r"^sp[0-9.]+-", "", s)))) for s in speakers]
            rows = [(s, v) for s, v in rows if v is not None]
            if rows:
                _write_table(self.folder / f"spk2{attribute}", rows)
            elif (self.folder / f"spk2{attribute}").exists():
                (self.folder / f"spk2{attribute}").unlink()

    def __enter__(self) -> DataDirWriter:
        return self

    def __exit__(self, kind, *_) -> None:
        self.close(ok=kind is None)


def read_table(path: Path) -> dict[str, str]:
    """Read a Kaldi ``key value`` table written by this module."""
    if not path.is_file():
        raise DataDirError(f"{path} is missing")
    table = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        key, _, value = line.partition(" ")
        if key:
            table[key] = value
    return table


def read_data_dir(folder: str | Path) -> list[Utterance]:
    """Read a data dir written by :func:`write_data_dir` back into utterances."""
    return list(iter_data_dir(folder))


def iter_data_dir(folder: str | Path) -> Iterator[Utterance]:
    """The utterances of a data dir in id order, its sorted tables joined a line at a time (``wav.scp`` read
    whole only when ``segments`` maps utterances to recordings); a dir whose tables are out of order is read
    whole instead."""
    folder = Path(folder)
    try:  # a first pass checks the order, so that nothing is given before a table turns out unsorted
        drain(*(sorted_rows(path) for path in folder.iterdir() if path.name in TABLES))
    except Unsorted:
        return (yield from _joined_utterances(folder, merge=False))
    yield from _joined_utterances(folder, merge=True)


def _joined_utterances(folder: Path, merge: bool) -> Iterator[Utterance]:
    """:func:`iter_data_dir` with the tables merged as read (``merge``) or looked up in dicts."""
    for name in ("wav.scp", "text", "utt2spk", "utt2dur", "utt2sr"):
        if not (folder / name).is_file():
            raise DataDirError(f"{folder / name} is missing")
    segmented = (folder / "segments").is_file()
    optional = ("segments", "utt2speed", "utt2corpus")
    if merge:
        streams = {name: optional_lookup(folder / name) for name in ("utt2spk", "utt2dur", "utt2sr", *optional)}
        get = {name: value for name, (value, _) in streams.items()}
        wav_rows = iter(()) if segmented else sorted_rows(folder / "wav.scp")
        wav = read_table(folder / "wav.scp").get if segmented else lookup(wav_rows)
        texts: Iterator[tuple[str, str]] = sorted_rows(folder / "text")
    else:
        tables = {name: read_table(folder / name) if (folder / name).is_file() else {}
                  for name in ("utt2spk", "utt2dur", "utt2sr", *optional)}
        get = {name: table.get for name, table in tables.items()}
        wav = read_table(folder / "wav.scp").get
        text_table = read_table(folder / "text")
        texts = ((utt, text_table[utt]) for utt in sorted(text_table))
    for utt, text in texts:
        spk, dur, rate = get["utt2spk"](utt), get["utt2dur"](utt), get["utt2sr"](utt)
        if spk is None or dur is None or rate is None:
            raise DataDirError(f"{folder}: utterance {utt} is missing from utt2spk, utt2dur or utt2sr")
        if segmented:
            segment = get["segments"](utt)
            if segment is None:
                raise DataDirError(f"{folder}: utterance {utt} is missing from segments")
            rec, start, end = segment.split()
            start_s, end_s = float(start), (None if float(end) < 0 else float(end))
        else:
            rec, start_s, end_s = utt, None, None
        audio = wav(rec)
        if audio is None:
            raise DataDirError(f"{folder}: recording {rec} of {utt} is missing from wav.scp")
        yield Utterance(utt, spk, audio, text, float(dur), int(rate), rec, start_s, end_s,
                        speed=float(get["utt2speed"](utt) or 1.0), corpus=get["utt2corpus"](utt) or "")
    if merge:
        drain(wav_rows, *(rows for _, rows in streams.values()))


def extra_utterances(folder: str | Path) -> set[str]:
    """The utterances of data dir ``folder`` that come from ``corpus.extra_training`` corpora (training only:
    kept out of the LM, the held-out utterances and decoder tuning)."""
    path = Path(folder) / "utt2corpus"
    return set(read_table(path)) if path.is_file() else set()


def own_texts(folder: str | Path) -> dict[str, str]:
    """Transcripts of the utterances of ``folder`` that are the experiment's own corpus's."""
    extra = extra_utterances(folder)
    return {u: t for u, t in read_table(Path(folder) / "text").items() if u not in extra}
