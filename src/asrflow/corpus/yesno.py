"""Kaldi "yesno" (OpenSLR SLR1): 60 files, one speaker, eight Hebrew yes/no words each.

The file name is the transcript (``0`` = no, ``1`` = yes). Kaldi's split: ``0_*`` train (31),
``1_*`` test (29).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from asrflow.corpus.base import Listing, RawUtterance, locate
from asrflow.corpus.download import Source

SOURCE = Source(
    url="https://www.openslr.org/resources/1/waves_yesno.tar.gz",
    dest="yesno/waves_yesno",
    strip="waves_yesno",
)
_WORDS = {"0": "no", "1": "yes"}


@dataclass
class YesNo:
    """Recipe for yesno; ``root`` is the ``waves_yesno`` folder."""

    root: Path
    name: str = "yesno"

    @classmethod
    def from_config(cls, corpus: dict) -> YesNo:
        return cls(locate("yesno/waves_yesno", corpus["path"], SOURCE, corpus["download_dir"]))

    def list_utterances(self) -> Listing:
        listing = Listing()
        for wav in sorted(self.root.glob("*.wav")):
            fields = wav.stem.split("_")
            if all(f in _WORDS for f in fields):
                text: str | None = " ".join(_WORDS[f] for f in fields)
                problem = None
            else:
                text, problem = None, f"file name {wav.name} is not a yes/no transcript (0/1 fields)"
            listing.utterances.append(
                RawUtterance(wav.stem, "global", str(wav), text, problem=problem, source=wav.name)
            )
        return listing

    def splits(self, valid: dict[str, str]) -> dict[str, list[str]]:
        ids = sorted(valid)
        return {
            "train": [u for u in ids if u.startswith("0_")],
            "test": [u for u in ids if u.startswith("1_")],
        }
