"""speechocean762 (OpenSLR 101): 5,000 read English sentences by 250 non-native speakers, 16 kHz.

Children of 6-15 and adults, female and male, whose first language is Mandarin; 125 training
and 125 test speakers (2,500 utterances each, no speaker in both). The corpus is distributed as
Kaldi data dirs, ``train/`` and ``test/`` (``wav.scp`` with paths relative to the corpus root,
``WAVE/SPEAKERxxxx/*.WAV``; ``text``, ``utt2spk``, ``spk2utt``, ``spk2age``, ``spk2gender``), with
its lexicon in ``resource/lexicon.txt`` (CMU phones with stress). The corpus's own split is kept,
and so are the speakers' age and gender.

Found at ``corpus.path``, else ``$ASRFLOW_DATA_MIRROR/speechocean762``, else downloaded from
OpenSLR (about 520 MB).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from asrflow.corpus.base import CorpusError, locate
from asrflow.corpus.download import Source
from asrflow.corpus.kaldi_dir import KaldiDir

SOURCE = Source(
    url="https://www.openslr.org/resources/101/speechocean762.tar.gz",
    dest="speechocean762",
    strip="speechocean762",
)
#: the corpus's own splits, as its data dirs are named
SPLITS = ("train", "test")


@dataclass
class SpeechOcean762(KaldiDir):
    """Recipe for speechocean762; ``root`` holds ``train/``, ``test/``, ``WAVE/`` and ``resource/``."""

    name: str = "speechocean762"

    @classmethod
    def from_config(cls, corpus: dict) -> SpeechOcean762:
        return cls(locate("speechocean762", corpus["path"], SOURCE, corpus["download_dir"]))

    def data_dirs(self) -> dict[str, Path]:
        missing = [f"{s}/wav.scp" for s in SPLITS if not (self.root / s / "wav.scp").is_file()]
        if missing:
            raise CorpusError(f"{self.root} is not a speechocean762 copy: no {', '.join(missing)}")
        return {s: self.root / s for s in SPLITS}

    @property
    def lexicon(self) -> Path:
        """The corpus's pronunciation lexicon (word, then CMU phones with stress markers)."""
        return self.root / "resource" / "lexicon.txt"
