"""What the text-to-speech recipes (``espeak``, ``flite``) share: the levels and margins of a take, and a
synthesis run that is written once and reused.

A synthesiser's word comes out clean: digital or near-digital silence around it, always at the same level.
Each recipe finds where the speech starts and ends, keeps a random margin of what surrounds it (:func:`cut`),
scales it to a random peak and adds faint white noise, the background of real recordings (:func:`level`).
"""

from __future__ import annotations

import hashlib
import json
import random
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from asrflow.corpus.base import CorpusError, Listing, RawUtterance, round_robin_split

#: Margins kept around the speech, seconds: before it, after it.
LEAD_S = (0.0, 0.05)
TAIL_S = (0.01, 0.1)
#: Peak level (of full scale) and background-noise level (dBFS) drawn per utterance.
PEAK = (0.3, 0.9)
NOISE_DBFS = (-62.0, -45.0)


@dataclass(frozen=True)
class Levels:
    """One take's draws for its level, noise and margins."""

    peak: float
    noise_dbfs: float
    lead_s: float
    tail_s: float
    noise_seed: int


def draw_levels(rng: random.Random, noise_seed: int) -> Levels:
    """Peak, noise level, lead and tail margins, in that order, from ``rng``."""
    return Levels(peak=rng.uniform(*PEAK), noise_dbfs=rng.uniform(*NOISE_DBFS), lead_s=rng.uniform(*LEAD_S),
                  tail_s=rng.uniform(*TAIL_S), noise_seed=noise_seed)


def cut(signal: np.ndarray, sample_rate: int, first: int, end: int, levels: Levels) -> np.ndarray:
    """``signal[first:end]`` (the speech) with up to the take's lead and tail margins of what surrounds it."""
    start = max(0, first - int(levels.lead_s * sample_rate))
    stop = min(signal.size, end + int(levels.tail_s * sample_rate))
    return signal[start:stop]


def level(speech: np.ndarray, levels: Levels) -> np.ndarray:
    """``speech`` scaled to the take's peak, plus its white background noise, clipped to full scale."""
    peak = np.abs(speech).max() if speech.size else 0.0
    if peak == 0.0:
        raise ValueError("the synthesiser produced only silence")
    scaled = speech * (levels.peak / peak)
    noise = np.random.default_rng(levels.noise_seed).normal(0.0, 10 ** (levels.noise_dbfs / 20), scaled.size)
    return np.clip(scaled + noise, -1.0, 1.0)


def synthesize_once(root: Path, takes: Sequence[Any], speak: Callable[[Any, Path], str | None],
                    manifest: dict[str, Any]) -> dict[str, str]:
    """Write every take's ``<root>/<utt_id>.wav`` with ``speak`` (in threads: synthesisers run as subprocesses)
    unless an earlier run finished there; the problems by utterance id.

    ``root/done.json`` (``manifest`` plus the problems), written atomically last, marks a finished run.
    """
    done = root / "done.json"
    if done.is_file():
        return json.loads(done.read_text())["problems"]
    root.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor() as pool:
        found = list(pool.map(lambda t: speak(t, root / f"{t.utt_id}.wav"), takes))
    problems = {t.utt_id: p for t, p in zip(takes, found) if p is not None}
    partial = done.with_suffix(".tmp")
    partial.write_text(json.dumps({**manifest, "utterances": len(takes), "problems": problems}, indent=1))
    partial.replace(done)
    return problems


def cache_folder(corpus: dict, recipe: str, identity: dict[str, Any]) -> Path:
    """``<corpus.path or download_dir/recipe>/<digest>``: the digest (12 hex digits) covers ``identity`` (the
    settings, the synthesiser's version, the recipe's version), so changed settings write a new folder."""
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:12]
    base = Path(corpus["path"]).expanduser() if corpus["path"] else Path(corpus["download_dir"]) / recipe
    return base / digest


def sentences(corpus: dict, block: dict, recipe: str) -> list[str]:
    """What a recipe is to say: its block's ``sentences``, then the lines of ``corpus.transcripts``."""
    said = list(block["sentences"])
    if corpus["transcripts"]:
        path = Path(corpus["transcripts"]).expanduser()
        if not path.is_file():
            raise CorpusError(f"corpus.transcripts {path} not found (the {recipe} recipe's sentences, one a line)")
        said += [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not said:
        raise CorpusError(f"the {recipe} recipe has nothing to say: give {recipe}.sentences or corpus.transcripts")
    return said


@dataclass
class SyntheticSpeech(ABC):
    """A text-to-speech recipe: ``root`` is the folder its audio is (or will be) written to, ``version`` the
    synthesiser's. A recipe names itself and says how to read its settings, plan its takes, speak one and
    describe one (:class:`asrflow.corpus.espeak.Espeak`, :class:`asrflow.corpus.flite.Flite`)."""

    root: Path
    settings: Any
    version: str
    name: ClassVar[str]
    recipe_version: ClassVar[int]

    @classmethod
    def from_config(cls, corpus: dict) -> "SyntheticSpeech":
        version = cls.program_version()
        settings = cls.read_settings(corpus)
        identity = {"settings": asdict(settings), cls.name: version, "recipe": cls.recipe_version}
        return cls(cache_folder(corpus, cls.name, identity), settings, version)

    def list_utterances(self) -> Listing:
        """Synthesise the audio unless an earlier run left it complete, then list it."""
        takes = self.plan(self.settings)
        problems = synthesize_once(self.root, takes, self.speak, {"settings": asdict(self.settings),
                                                                  self.name: self.version})
        return Listing([RawUtterance(t.utt_id, t.speaker, str(self.root / f"{t.utt_id}.wav"), t.text,
                                     problem=problems.get(t.utt_id), source=self.describe(t))
                        for t in takes])

    def splits(self, valid: dict[str, str]) -> dict[str, list[str]]:
        return round_robin_split(list(valid))

    @staticmethod
    @abstractmethod
    def program_version() -> str:
        """The synthesiser's version; a :class:`CorpusError` naming its package when it is missing."""

    @staticmethod
    @abstractmethod
    def read_settings(corpus: dict) -> Any:
        """The recipe's settings from a resolved corpus section."""

    @staticmethod
    @abstractmethod
    def plan(settings: Any) -> list[Any]:
        """Every take (``utt_id``, ``speaker``, ``text``, ...), every draw made."""

    @staticmethod
    @abstractmethod
    def speak(take: Any, path: Path) -> str | None:
        """Write one take's wav to ``path``; a problem, or ``None``."""

    @staticmethod
    @abstractmethod
    def describe(take: Any) -> str:
        """How the take was made (the listing's ``source``)."""
