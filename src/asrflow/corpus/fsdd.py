"""Free Spoken Digit Dataset: 3000 isolated English digits, six speakers, 8 kHz.

Files are ``{digit}_{speaker}_{take}.wav``. Standard split: takes 0-4 test (300),
takes 5-49 train (2700). Protocol ``loso`` adds ``loso_<speaker>_train`` /
``loso_<speaker>_test`` for each speaker (train on five, test on the sixth).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from asrflow.corpus.base import Listing, RawUtterance, locate
from asrflow.corpus.download import Source

_TAG = "v1.0.10"
SOURCE = Source(
    url=f"https://github.com/Jakobovski/free-spoken-digit-dataset/archive/refs/tags/{_TAG}.tar.gz",
    dest="fsdd",
    strip=f"free-spoken-digit-dataset-{_TAG.lstrip('v')}",
)
_NAME = re.compile(r"^(\d)_([A-Za-z0-9]+)_(\d+)$")
TEST_TAKES = 5


@dataclass
class FSDD:
    """Recipe for FSDD; ``root`` holds ``recordings/``."""

    root: Path
    protocols: list[str] = field(default_factory=lambda: ["standard"])
    name: str = "fsdd"

    @classmethod
    def from_config(cls, corpus: dict) -> FSDD:
        root = locate("fsdd", corpus["path"], SOURCE, corpus["download_dir"])
        return cls(root, list(corpus["protocols"]))

    def list_utterances(self) -> Listing:
        listing = Listing()
        recordings = self.root / "recordings"
        for wav in sorted(recordings.glob("*.wav")):
            match = _NAME.match(wav.stem)
            if not match:
                listing.utterances.append(
                    RawUtterance(wav.stem.replace(" ", "_"), "unknown", str(wav), None,
                                 problem=f"file name {wav.name} is not digit_speaker_take.wav",
                                 source=wav.name)
                )
                continue
            digit, speaker, take = match.groups()
            # The transcript is the numeral; the shared normaliser spells it ("0" → "zero").
            listing.utterances.append(
                RawUtterance(f"{speaker}-{digit}_{take}", speaker, str(wav), digit, source=wav.name)
            )
        return listing

    def splits(self, valid: dict[str, str]) -> dict[str, list[str]]:
        ids = sorted(valid)
        out: dict[str, list[str]] = {}
        if "standard" in self.protocols:
            take = {u: int(u.rsplit("_", 1)[1]) for u in ids}
            out["train"] = [u for u in ids if take[u] >= TEST_TAKES]
            out["test"] = [u for u in ids if take[u] < TEST_TAKES]
        if "loso" in self.protocols:
            for speaker in sorted(set(valid.values())):
                out[f"loso_{speaker}_train"] = [u for u in ids if valid[u] != speaker]
                out[f"loso_{speaker}_test"] = [u for u in ids if valid[u] == speaker]
        return out
