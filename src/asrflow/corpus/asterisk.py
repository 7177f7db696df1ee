"""Asterisk core sound prompts (one recipe, any language: en, es, fr, ...).

``core-sounds-<lang>.txt`` has ``relative/path: Text as read.`` per prompt; ``;`` starts a
comment. Some prompts are non-speech (``[beep]``, ``(silence)``): the shared normaliser
empties them and validation rejects them. Utterance ids are the relative paths
(``digits/7``); split: sorted ids, index % 5 == 0 test, the rest train.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from asrflow.corpus.base import CorpusError, Listing, RawUtterance, locate, round_robin_split
from asrflow.corpus.download import Source

VERSION = "1.6.1"
_RELEASES = "https://downloads.asterisk.org/pub/telephony/sounds/releases"


def source(lang: str) -> Source:
    """The release tarball of ``lang``'s wav prompts (its listing ships inside it)."""
    archive = f"{_RELEASES}/asterisk-core-sounds-{lang}-wav-{VERSION}.tar.gz"
    return Source(url=archive, dest=f"asterisk/{lang}", checksum_url=archive + ".sha1")


def _speaker(lang: str) -> str:
    return f"asterisk_{lang}"


@dataclass
class Asterisk:
    """Recipe for the Asterisk prompts of one language; ``root`` holds the wavs and listing."""

    root: Path
    lang: str = "en"
    name: str = "asterisk"

    @classmethod
    def from_config(cls, corpus: dict) -> Asterisk:
        lang = corpus["language"]
        root = locate(f"asterisk/{lang}", corpus["path"], source(lang), corpus["download_dir"])
        return cls(root, lang)

    @property
    def listing_file(self) -> Path:
        return self.root / f"core-sounds-{self.lang}.txt"

    def list_utterances(self) -> Listing:
        if not self.listing_file.is_file():
            raise CorpusError(f"{self.listing_file} not found: the prompt listing is needed")
        listing = Listing()
        speaker = _speaker(self.lang)
        seen: set[str] = set()
        raw_lines = self.listing_file.read_bytes().splitlines()
        for number, raw in enumerate(raw_lines, start=1):
            where = f"{self.listing_file.name}:{number}"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                line, problem = raw.decode("utf-8", errors="replace"), f"line {where} is not valid UTF-8"
            else:
                problem = None
            line = line.strip().lstrip("\ufeff")
            if not line or line.startswith(";") or ":" not in line:
                continue
            key, text = (part.strip() for part in line.split(":", 1))
            wav = self.root / f"{key}.wav"
            seen.add(key)
            listing.utterances.append(
                RawUtterance(f"{speaker}-{key}", speaker, str(wav), text, problem=problem, source=where)
            )
        for wav in sorted(self.root.rglob("*.wav")):
            key = wav.relative_to(self.root).with_suffix("").as_posix()
            if key not in seen:
                listing.utterances.append(
                    RawUtterance(f"{speaker}-{key}", speaker, str(wav), None, source=wav.name)
                )
        return listing

    def splits(self, valid: dict[str, str]) -> dict[str, list[str]]:
        return round_robin_split(list(valid))
