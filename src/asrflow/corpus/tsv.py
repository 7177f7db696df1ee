"""Import a folder of audio with a transcript TSV.

``corpus.transcripts`` is a UTF-8 TSV, one utterance a line::

    <audio path relative to corpus.path>\t<transcript>[\t<speaker>[\t<split>]]

A header line starting with ``path`` or ``#`` is skipped. The utterance id is
``<speaker>-<path without extension>`` with whitespace and quotes replaced by ``_``.
Without a split column, the split is the Asterisk rule: sorted ids, index % 5 == 0 test.
Audio files in the folder that the TSV does not mention are reported as having no transcript.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from asrflow.corpus.base import CorpusError, Listing, RawUtterance, round_robin_split

AUDIO_SUFFIXES = (".wav", ".flac", ".ogg", ".mp3", ".sph", ".aiff", ".aif")
_UNSAFE = re.compile(r"[\s\"'`]+")


def utterance_id(speaker: str, relative: str) -> str:
    """A Kaldi-safe id: speaker prefix, path without suffix, no whitespace or quotes."""
    stem = relative.rsplit(".", 1)[0] if "." in Path(relative).name else relative
    return _UNSAFE.sub("_", f"{speaker}-{stem}")


@dataclass
class TsvFolder:
    """Recipe for a folder of audio plus a transcript TSV."""

    root: Path
    transcripts: Path
    name: str = "tsv"
    _split_of: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_config(cls, corpus: dict) -> TsvFolder:
        if not corpus["path"] or not corpus["transcripts"]:
            raise CorpusError("the tsv recipe needs corpus.path (audio folder) and corpus.transcripts (TSV)")
        root = Path(corpus["path"]).expanduser()
        tsv = Path(corpus["transcripts"]).expanduser()
        if not root.is_dir():
            raise CorpusError(f"corpus.path {root} is not a folder")
        if not tsv.is_file():
            raise CorpusError(f"corpus.transcripts {tsv} not found")
        return cls(root, tsv)

    def list_utterances(self) -> Listing:
        listing = Listing()
        mentioned: set[str] = set()
        for number, raw in enumerate(self.transcripts.read_bytes().splitlines(), start=1):
            where = f"{self.transcripts.name}:{number}"
            try:
                line, problem = raw.decode("utf-8"), None
            except UnicodeDecodeError:
                line, problem = raw.decode("utf-8", errors="replace"), f"line {where} is not valid UTF-8"
            if not line.strip() or line.startswith("#") or (number == 1 and line.startswith("path\t")):
                continue
            fields = line.rstrip("\r\n").split("\t")
            relative = fields[0].strip()
            text = fields[1] if len(fields) > 1 else None
            speaker = fields[2].strip() if len(fields) > 2 and fields[2].strip() else "spk"
            speaker = _UNSAFE.sub("_", speaker)
            utt = utterance_id(speaker, relative)
            mentioned.add(relative)
            if len(fields) > 3 and fields[3].strip():
                self._split_of.setdefault(utt, fields[3].strip())
            listing.utterances.append(
                RawUtterance(utt, speaker, str(self.root / relative), text, problem=problem, source=where)
            )
        for audio in sorted(p for p in self.root.rglob("*") if p.suffix.lower() in AUDIO_SUFFIXES):
            relative = audio.relative_to(self.root).as_posix()
            if relative not in mentioned:
                listing.utterances.append(
                    RawUtterance(utterance_id("spk", relative), "spk", str(audio), None, source=relative)
                )
        return listing

    def splits(self, valid: dict[str, str]) -> dict[str, list[str]]:
        if not self._split_of:
            return round_robin_split(list(valid))
        out: dict[str, list[str]] = {}
        for utt in sorted(valid):
            out.setdefault(self._split_of.get(utt, "train"), []).append(utt)
        return out
