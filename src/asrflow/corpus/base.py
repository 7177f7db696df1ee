"""What a corpus recipe produces, and where it finds its files.

A recipe lists :class:`RawUtterance` records (id, speaker, audio, raw transcript) and,
once the data stage has validated them, assigns the surviving ids to named splits.
It never reads audio and never normalises text: validation and normalisation are the
data stage's job, the same for every corpus.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from asrflow.corpus.download import Source, fetch

#: Environment variable naming a local mirror laid out as ``<mirror>/<corpus>/...``.
MIRROR_ENV = "ASRFLOW_DATA_MIRROR"


class CorpusError(RuntimeError):
    """The corpus cannot be listed at all (missing folder, unreadable listing)."""


@dataclass(frozen=True)
class RawUtterance:
    """One utterance as a recipe lists it, before validation.

    Attributes:
        utt_id: Kaldi utterance id (no whitespace; speaker id as prefix where possible).
        speaker: speaker id.
        audio: a file path, or a Kaldi pipe command ending in ``|``.
        text: raw transcript, or ``None`` when the corpus has none for this audio.
        start, end: segment bounds in seconds (Kaldi ``segments``), or ``None`` for the whole file.
        recording: recording id (``wav.scp`` key); defaults to ``utt_id``.
        problem: a fault found while listing (for example a non-UTF-8 transcript line);
            such an utterance is rejected with this reason.
        source: where the transcript came from (file and line), for the report.
        split: the split the utterance belongs to, when the recipe knows it as it lists it (a corpus
            distributed as split folders); then the data stage streams the corpus and does not call
            :meth:`Recipe.splits`.
    """

    utt_id: str
    speaker: str
    audio: str
    text: str | None
    start: float | None = None
    end: float | None = None
    recording: str | None = None
    problem: str | None = None
    source: str = ""
    split: str | None = None

    @property
    def recording_id(self) -> str:
        return self.recording or self.utt_id


#: Per-speaker attributes a recipe may know, written to each data dir as ``spk2<name>`` (Kaldi's ``spk2gender``)
SPEAKER_ATTRIBUTES = ("gender", "age")


@dataclass
class Listing:
    """A recipe's output: the utterances, and what it knows of their speakers.

    ``speakers`` maps an attribute of :data:`SPEAKER_ATTRIBUTES` to ``{speaker: value}`` (a speaker
    may lack one); the data stage writes them as ``spk2gender``, ``spk2age``, ... and scoring can
    group speakers by them.
    """

    utterances: Iterable[RawUtterance] = field(default_factory=list)  # a list, or a stream read once
    speakers: dict[str, dict[str, str]] = field(default_factory=dict)


class Recipe(Protocol):
    """A corpus recipe: list utterances, then split the validated ids."""

    name: str

    def list_utterances(self) -> Listing: ...

    def splits(self, valid: dict[str, str]) -> dict[str, list[str]]:
        """Map split name → sorted utterance ids, given ``{utt_id: speaker}`` of valid utterances."""
        ...


def mirror_root() -> Path | None:
    """The local mirror from ``$ASRFLOW_DATA_MIRROR``, if set."""
    value = os.environ.get(MIRROR_ENV)
    return Path(value).expanduser() if value else None


def locate(subdir: str, explicit: str | None, source: Source | None, download_dir: str | Path) -> Path:
    """Find a corpus folder: an explicit path, else the mirror, else a download.

    Args:
        subdir: the corpus folder inside a mirror or a download (``yesno/waves_yesno``).
        explicit: ``corpus.path`` from the config, which wins when given.
        source: canonical download for machines that are online (``None``: not downloadable).
        download_dir: where downloads are unpacked (the same layout as a mirror).
    """
    if explicit:
        path = Path(explicit).expanduser()
        if not path.is_dir():
            raise CorpusError(f"corpus.path {path} is not a folder")
        return path
    mirror = mirror_root()
    if mirror is not None:
        path = mirror / subdir
        if not path.is_dir():
            raise CorpusError(f"${MIRROR_ENV}={mirror} has no {subdir}/ folder")
        return path
    local = Path(download_dir) / subdir
    if local.is_dir():
        return local
    if source is None:
        raise CorpusError(f"no local copy of {subdir} and no download source; set corpus.path")
    fetch(source, Path(download_dir))
    if not local.is_dir():
        raise CorpusError(f"downloaded {source.url} but {local} is not there")
    return local


def round_robin_split(ids: list[str], every: int = 5) -> dict[str, list[str]]:
    """Sort ids in string order; index % ``every`` == 0 goes to test, the rest to train."""
    ordered = sorted(ids)
    return {
        "train": [u for i, u in enumerate(ordered) if i % every != 0],
        "test": [u for i, u in enumerate(ordered) if i % every == 0],
    }
