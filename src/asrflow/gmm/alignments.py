"""Frame alignments as Kaldi binary archives of int32 vectors, read lazily.

An alignment folder (``ali/``) holds three archives, each with its ``.scp`` index::

    transition_ids.ark  the forced alignment itself (Kaldi's ali.*.gz)
    pdfs.ark            the pdf of every frame (ali-to-pdf)
    phones.ark          the phone of every frame, ids of the lang's phones.txt (ali-to-phones --per-frame)

Kaldi's own tools read them (``copy-int-vector scp:ali/pdfs.scp ark,t:-`` prints them as
text). Readers get a mapping that loads one utterance's vector when asked for it through the
``.scp`` offsets, so no stage holds a whole corpus's alignments to read a few of them, and a
shard's worth is 4 bytes a frame.

While a GMM trains, the alignments never gather on the driver: each E-step task writes its shard's
new alignments into an archive of its own (:func:`write_archive`, in the training's state folder)
and returns only where each utterance's vector is (``<archive>:<offset>``, an ``.scp`` value); the
next tasks get those references (:func:`shard_alignments`) and read the vectors themselves
(:func:`load_alignment`).
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import kaldiio
import numpy as np

from asrflow.features.ark import read_scp, write_ark

#: The archives of an alignment folder.
KINDS = ("transition_ids", "pdfs", "phones")

#: One utterance's alignment as a task receives it: the int32 vector, or where it is stored (a Kaldi
#: rxfilename ``<archive>:<offset>``, read by the task itself).
Alignment = np.ndarray | str


def load_alignment(value: Alignment) -> np.ndarray:
    """The vector of an :data:`Alignment` (read from its archive when it is a reference)."""
    return np.asarray(kaldiio.load_mat(value), dtype=np.int32) if isinstance(value, str) else value


class StoredAlignments(Mapping):
    """Alignments stored in archives: utterance → vector, each read when it is looked up; ``refs`` holds where
    each one is (utterance → ``<archive>:<offset>``), all a task needs to be given."""

    def __init__(self, refs: Mapping[str, str] | None = None) -> None:
        self.refs: dict[str, str] = dict(refs or {})

    def __getitem__(self, utt: str) -> np.ndarray:
        return load_alignment(self.refs[utt])

    def __iter__(self) -> Iterator[str]:
        return iter(self.refs)

    def __len__(self) -> int:
        return len(self.refs)

    def __contains__(self, utt: object) -> bool:
        return utt in self.refs


def shard_alignments(alignments: Mapping[str, np.ndarray], utts: Iterable[str]) -> dict[str, Alignment]:
    """What a task is given of the alignments of ``utts`` (those that have one): references when ``alignments``
    is stored (:class:`StoredAlignments`; the task reads them), else the vectors."""
    source = alignments.refs if isinstance(alignments, StoredAlignments) else alignments
    return {u: source[u] for u in utts if u in source}


def write_archive(path: str | Path, alignments: Mapping[str, np.ndarray]) -> dict[str, str]:
    """Write ``alignments`` (sorted by utterance) into the one archive ``path`` and return where each vector is.

    Written under a temporary name and renamed, so a task that runs twice (a retry, a lost worker) leaves
    one whole archive, never a torn one.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = write_ark(path, ((utt, vector_bytes(alignments[utt])) for utt in sorted(alignments)))
    return dict(line.split(" ", 1) for line in lines)


def vector_bytes(vector: np.ndarray) -> bytes:
    """Kaldi's binary encoding of an int32 vector (as ``copy-int-vector`` writes it; through kaldiio)."""
    buffer = io.BytesIO()
    kaldiio.save_mat(buffer, np.asarray(vector, dtype=np.int32))
    return buffer.getvalue()


def write_alignments(folder: str | Path, tid2pdf: np.ndarray, tid2phone: np.ndarray,
                     alignments: Mapping[str, np.ndarray]) -> None:
    """Write ``alignments`` (transition ids per frame) and the pdfs and phones they map to (``tid2pdf``,
    ``tid2phone``: indexed by transition id) into ``folder``, utterances in sorted order."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    writers = {kind: kaldiio.WriteHelper(f"ark,scp:{folder / kind}.ark,{folder / kind}.scp") for kind in KINDS}
    try:
        for utt in sorted(alignments):
            tids = np.asarray(load_alignment(alignments[utt]), dtype=np.int32)
            writers["transition_ids"](utt, tids)
            writers["pdfs"](utt, np.asarray(tid2pdf[tids], dtype=np.int32))
            writers["phones"](utt, np.asarray(tid2phone[tids], dtype=np.int32))
    finally:
        for writer in writers.values():
            writer.close()


def alignment_index(folder: str | Path, kind: str = "transition_ids") -> Path:
    """The ``.scp`` of archive ``kind`` in alignment folder ``folder``."""
    if kind not in KINDS:
        raise ValueError(f"unknown alignment archive {kind!r}: one of {', '.join(KINDS)}")
    return Path(folder) / f"{kind}.scp"


def read_alignments(folder: str | Path, kind: str = "transition_ids") -> StoredAlignments:
    """Archive ``kind`` of alignment folder ``folder`` as a mapping utterance → int32 vector, each vector read
    from the archive when it is looked up (only the ``.scp`` is read here)."""
    index = alignment_index(folder, kind)
    if not index.is_file():
        raise FileNotFoundError(f"no {kind} alignments in {folder} ({index.name} is missing)")
    return StoredAlignments(read_scp(index))
