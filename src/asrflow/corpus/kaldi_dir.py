"""Import existing Kaldi data dirs (``wav.scp``, ``text``, ``utt2spk``, optional ``segments``).

``corpus.path`` is either one data dir (its folder name becomes the split name) or a folder
whose sub-folders with a ``wav.scp`` are the splits (``train/``, ``test/``, ...). ``wav.scp``
entries may be file paths or Kaldi pipe commands ending in ``|``. A data dir's ``spk2gender``
and ``spk2age``, when present, are kept (the data stage writes them into every split).

A relative path in ``wav.scp`` is looked up, in this order, against the data dir's parent (a
corpus distributed as ``<root>/WAVE/...`` with ``<root>/train/wav.scp``, as speechocean762 is),
``corpus.path`` itself, and the data dir; the first that exists is taken. When none does, the
path against the data dir's parent is reported as missing (never the working directory).

Kaldi keeps a data dir's tables sorted, so the recipe lists each data dir by walking its ``wav.scp``
(or ``segments``), ``text`` and ``utt2spk`` side by side, a line at a time, and the data stage
streams the corpus without holding it; a dir with a table out of order is read whole instead.
Each utterance is listed with its data dir's name as its split.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from asrflow.corpus.base import SPEAKER_ATTRIBUTES, CorpusError, Listing, RawUtterance


def read_table(path: Path) -> tuple[dict[str, str], list[tuple[str, str]]]:
    """Read a Kaldi ``key value`` table.

    Returns the table and a list of ``(key or line, problem)`` for lines that are not UTF-8,
    have no key, or repeat a key.
    """
    table: dict[str, str] = {}
    problems: list[tuple[str, str]] = []
    for number, raw in enumerate(path.read_bytes().splitlines(), start=1):
        where = f"{path.name}:{number}"
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            key = raw.split(maxsplit=1)[0].decode("utf-8", errors="replace") if raw.split() else where
            problems.append((key, f"line {where} is not valid UTF-8"))
            continue
        parts = line.strip().split(maxsplit=1)
        if not parts:
            continue
        key, value = parts[0], parts[1] if len(parts) > 1 else ""
        if key in table:
            problems.append((key, f"duplicate key {key} at {where}"))
            continue
        table[key] = value
    return table, problems


def _lines(path: Path) -> Iterator[tuple[str, int, str, str | None]]:
    """``(key, line number, value, problem)`` of each non-empty line, decoded one at a time (the problem of a line
    that is not UTF-8)."""
    with open(path, "rb") as handle:
        for number, raw in enumerate(handle, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                key = raw.split(maxsplit=1)[0].decode("utf-8", errors="replace") if raw.split() else str(number)
                yield key, number, "", f"line {path.name}:{number} is not valid UTF-8"
                continue
            parts = line.strip().split(maxsplit=1)
            if parts:
                yield parts[0], number, parts[1] if len(parts) > 1 else "", None


def _tagged(tag: str, path: Path) -> Iterator[tuple[str, str, int, str, str | None]]:
    """:func:`_lines` of a table, each with the table's tag after its key."""
    for key, number, value, problem in _lines(path):
        yield key, tag, number, value, problem


def _in_order(path: Path) -> bool:
    """Whether the keys of a table never decrease (repeated keys are reported as duplicates, not disorder)."""
    last = ""
    for key, *_ in _lines(path):
        if key < last:
            return False
        last = key
    return True


@dataclass
class KaldiDir:
    """Recipe importing one or more Kaldi data dirs."""

    root: Path
    name: str = "kaldi_dir"

    @classmethod
    def from_config(cls, corpus: dict) -> KaldiDir:
        if not corpus["path"]:
            raise CorpusError("corpus.path must name a Kaldi data dir for the kaldi_dir recipe")
        root = Path(corpus["path"]).expanduser()
        if not root.is_dir():
            raise CorpusError(f"corpus.path {root} is not a folder")
        return cls(root)

    def data_dirs(self) -> dict[str, Path]:
        if (self.root / "wav.scp").is_file():
            return {self.root.name: self.root}
        dirs = {d.name: d for d in sorted(self.root.iterdir()) if (d / "wav.scp").is_file()}
        if not dirs:
            raise CorpusError(f"{self.root} has no wav.scp, nor sub-folders with one")
        return dirs

    def _tables(self, folder: Path) -> dict[str, Path]:
        """The tables of a data dir that list its utterances: ``entry`` (``segments``, else ``wav.scp``), ``text``
        and ``utt2spk`` (those it has)."""
        entry = folder / "segments" if (folder / "segments").is_file() else folder / "wav.scp"
        tables = {"entry": entry, "text": folder / "text", "utt2spk": folder / "utt2spk"}
        return {tag: path for tag, path in tables.items() if path.is_file()}

    def _stream_dir(self, split: str, folder: Path) -> Iterator[RawUtterance]:
        """The utterances of a data dir whose tables are sorted, its tables walked side by side."""
        tables = self._tables(folder)
        segmented = tables["entry"].name == "segments"
        wavs = read_table(folder / "wav.scp")[0] if segmented else {}
        rows = heapq.merge(*(_tagged(tag, path) for tag, path in tables.items()), key=lambda row: row[0])
        for utt, group in itertools.groupby(rows, key=lambda row: row[0]):
            found: dict[str, tuple[str, str | None]] = {}
            problem = None
            for _, tag, number, value, fault in group:
                if tag in found and tag != "utt2spk":
                    problem = problem or f"duplicate key {utt} at {tables[tag].name}:{number}"
                    continue
                found.setdefault(tag, (value, fault))
                if fault and tag != "utt2spk":
                    problem = problem or fault
            if "entry" not in found and problem is None:
                continue  # a transcript or speaker without audio is not an utterance
            value = found.get("entry", ("", None))[0]
            if segmented:
                rec, start, end, bad = _segment(utt, value)
                problem = problem or bad
            else:
                rec, start, end = utt, None, None
            yield self._raw(utt, rec, start, end, wavs if segmented else {utt: value} if "entry" in found else {},
                            found.get("text", (None, None))[0], found.get("utt2spk", (utt, None))[0], problem,
                            split, folder)

    def _list_dir(self, split: str, folder: Path) -> Iterator[RawUtterance]:
        """The utterances of a data dir with a table out of order: its tables read whole."""
        wavs, wav_problems = read_table(folder / "wav.scp")
        text, text_problems = read_table(folder / "text") if (folder / "text").is_file() else ({}, [])
        spk, _ = read_table(folder / "utt2spk") if (folder / "utt2spk").is_file() else ({}, [])
        segments, seg_problems = (
            read_table(folder / "segments") if (folder / "segments").is_file() else ({}, [])
        )
        problem_of = dict(wav_problems + text_problems + seg_problems)
        if segments:
            entries = {}
            for utt, value in segments.items():
                rec, start, end, bad = _segment(utt, value)
                if bad:
                    problem_of.setdefault(utt, bad)
                entries[utt] = (rec, start, end)
        else:
            entries = {utt: (utt, None, None) for utt in wavs}
        for utt in sorted(set(entries) | set(problem_of)):
            rec, start, end = entries.get(utt, (utt, None, None))
            yield self._raw(utt, rec, start, end, wavs, text.get(utt), spk.get(utt, utt), problem_of.get(utt),
                            split, folder)

    def _raw(self, utt: str, rec: str, start: float | None, end: float | None, wavs: dict[str, str],
             text: str | None, speaker: str, problem: str | None, split: str, folder: Path) -> RawUtterance:
        """The listed utterance, its audio resolved (or why it has none)."""
        audio = self._resolve(wavs[rec], folder) if rec in wavs else f"{folder / 'wav.scp'} (no entry for {rec})"
        if problem is None and rec not in wavs:
            problem = f"recording {rec} has no wav.scp entry"
        end = None if end is not None and end < 0 else end  # Kaldi: -1 means to the end
        return RawUtterance(utt, speaker, audio, text, start=start, end=end, recording=rec, problem=problem,
                            source=f"{folder.name}/text", split=split)

    def _resolve(self, value: str, folder: Path) -> str:
        """A ``wav.scp`` value with a relative file path made absolute (see the module docstring); absolute
        paths and pipe commands are kept as they are."""
        if value.rstrip().endswith("|") or Path(value).is_absolute():
            return value
        candidates = [folder.parent / value, self.root / value, folder / value]
        return str(next((c for c in candidates if c.is_file()), candidates[0]).resolve())

    def list_utterances(self) -> Listing:
        """Every data dir's utterances, streamed (each dir read a line at a time when its tables are sorted), and
        the speakers' ``spk2gender`` / ``spk2age``."""
        dirs = self.data_dirs()
        listing = Listing(utterances=self._stream(dirs))
        for folder in dirs.values():
            for attribute in SPEAKER_ATTRIBUTES:
                if (folder / f"spk2{attribute}").is_file():
                    table, _ = read_table(folder / f"spk2{attribute}")
                    listing.speakers.setdefault(attribute, {}).update(table)
        return listing

    def _stream(self, dirs: dict[str, Path]) -> Iterator[RawUtterance]:
        for split, folder in dirs.items():
            if all(_in_order(path) for path in self._tables(folder).values()):
                yield from self._stream_dir(split, folder)
            else:
                yield from self._list_dir(split, folder)

    def splits(self, valid: dict[str, str]) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {s: [] for s in self.data_dirs()}
        seen: set[str] = set()
        for raw in self.list_utterances().utterances:
            if raw.utt_id in valid and raw.utt_id not in seen and raw.split is not None:
                seen.add(raw.utt_id)  # an id listed twice belongs to the split it was listed in first
                out[raw.split].append(raw.utt_id)
        return {name: sorted(ids) for name, ids in out.items()}


def _segment(utt: str, value: str) -> tuple[str, float | None, float | None, str | None]:
    """A ``segments`` value: recording, start, end, and the problem of a line that does not parse."""
    fields = value.split()
    try:
        return fields[0], float(fields[1]), float(fields[2]), None
    except (IndexError, ValueError):
        return (fields[0] if fields else ""), None, None, f"bad segments line for {utt}: {value!r}"
