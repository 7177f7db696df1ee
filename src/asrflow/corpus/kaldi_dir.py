"""Import existing Kaldi data dirs (``wav.scp``, ``text``, ``utt2spk``, optional ``segments``).

``corpus.path`` is either one data dir (its folder name becomes the split name) or a folder
whose sub-folders with a ``wav.scp`` are the splits (``train/``, ``test/``, ...). ``wav.scp``
entries may be file paths or Kaldi pipe commands ending in ``|``. A data dir's ``spk2gender``
and ``spk2age``, when present, are kept (the data stage writes them into every split).

A relative path in ``wav.scp`` is looked up, in this order, against the data dir's parent (a
corpus distributed as ``<root>/WAVE/...`` with ``<root>/train/wav.scp``, as speechocean762 is),
``corpus.path`` itself, and the data dir; the first that exists is taken. When none does, the
path against the data dir's parent is reported as missing (never the working directory).
"""

from __future__ import annotations

from dataclasses import dataclass, field
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


@dataclass
class KaldiDir:
    """Recipe importing one or more Kaldi data dirs."""

    root: Path
    name: str = "kaldi_dir"
    _split_of: dict[str, str] = field(default_factory=dict)

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

    def _list_dir(self, split: str, folder: Path, listing: Listing) -> None:
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
                fields = value.split()
                try:
                    rec, start, end = fields[0], float(fields[1]), float(fields[2])
                except (IndexError, ValueError):
                    problem_of.setdefault(utt, f"bad segments line for {utt}: {value!r}")
                    rec, start, end = (fields[0] if fields else ""), None, None
                entries[utt] = (rec, start, end)
        else:
            entries = {utt: (utt, None, None) for utt in wavs}
        for utt in sorted(set(entries) | set(problem_of)):
            rec, start, end = entries.get(utt, (utt, None, None))
            audio = self._resolve(wavs[rec], folder) if rec in wavs else f"{folder / 'wav.scp'} (no entry for {rec})"
            problem = problem_of.get(utt)
            if problem is None and rec not in wavs:
                problem = f"recording {rec} has no wav.scp entry"
            end = None if end is not None and end < 0 else end  # Kaldi: -1 means to the end
            listing.utterances.append(
                RawUtterance(utt, spk.get(utt, utt), audio, text.get(utt), start=start, end=end,
                             recording=rec, problem=problem, source=f"{folder.name}/text")
            )
            self._split_of.setdefault(utt, split)
        for attribute in SPEAKER_ATTRIBUTES:
            if (folder / f"spk2{attribute}").is_file():
                table, _ = read_table(folder / f"spk2{attribute}")
                listing.speakers.setdefault(attribute, {}).update(table)

    def _resolve(self, value: str, folder: Path) -> str:
        """A ``wav.scp`` value with a relative file path made absolute (see the module docstring); absolute
        paths and pipe commands are kept as they are."""
        if value.rstrip().endswith("|") or Path(value).is_absolute():
            return value
        candidates = [folder.parent / value, self.root / value, folder / value]
        return str(next((c for c in candidates if c.is_file()), candidates[0]).resolve())

    def list_utterances(self) -> Listing:
        listing = Listing()
        for split, folder in self.data_dirs().items():
            self._list_dir(split, folder, listing)
        return listing

    def splits(self, valid: dict[str, str]) -> dict[str, list[str]]:
        if not self._split_of:
            self.list_utterances()
        out: dict[str, list[str]] = {s: [] for s in self.data_dirs()}
        for utt in sorted(valid):
            out[self._split_of[utt]].append(utt)
        return out
