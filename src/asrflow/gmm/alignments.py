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
new alignments into an archive of its own with its ``.scp`` index (:func:`write_archive`, in the
training's state folder) and returns only the index's path (:class:`Written`), so that what a reduction
carries to the driver is a path a shard, not a reference an utterance; the driver reads where each
utterance's vector is (``<archive>:<offset>``) from the indexes, the next tasks get those references
(:func:`shard_alignments`) and read the vectors themselves (:func:`load_alignment`).
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Iterable, Iterator, Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import kaldiio
import numpy as np

from asrflow.data.tables import atomic_binary, atomic_text
from asrflow.features.ark import scp_entries, write_ark, write_entry

#: The archives of an alignment folder.
KINDS = ("transition_ids", "pdfs", "phones")

#: One utterance's alignment as a task receives it: the int32 vector, or where it is stored (a Kaldi
#: rxfilename ``<archive>:<offset>``, read by the task itself).
Alignment = np.ndarray | str


#: One element of Kaldi's binary int32 vector: its width (4) then its value (``WriteBasicType`` of each).
_ELEMENT = np.dtype([("width", "i1"), ("value", "<i4")])
_HEADER = b"\0B\x04"  # binary mode, then the width of the size that follows


def vector_bytes(vector: np.ndarray) -> bytes:
    """Kaldi's binary encoding of an int32 vector, as ``copy-int-vector`` writes it: ``\\0B``, ``\\4<size>``,
    then ``\\4<value>`` per element (built in one numpy pass; kaldiio writes it an element at a time)."""
    values = np.asarray(vector).reshape(-1)
    elements = np.empty(len(values), dtype=_ELEMENT)
    elements["width"] = 4
    elements["value"] = values
    return _HEADER + struct.pack("<i", len(values)) + elements.tobytes()


def read_vector(stream: BinaryIO, where: str = "") -> np.ndarray:
    """The binary int32 vector at ``stream``'s position (the inverse of :func:`vector_bytes`); ``where``: named
    in the error."""
    header = stream.read(7)
    if len(header) < 7 or header[:3] != _HEADER:
        raise ValueError(f"{where}: not a Kaldi binary int32 vector")
    size = struct.unpack("<i", header[3:])[0]
    data = stream.read(5 * max(size, 0))
    elements = np.frombuffer(data, dtype=_ELEMENT) if size >= 0 and len(data) == 5 * size else None
    if elements is None or (elements["width"] != 4).any():
        raise ValueError(f"{where}: a truncated or malformed int32 vector of {size} elements")
    return elements["value"].astype(np.int32)


def load_alignment(value: Alignment) -> np.ndarray:
    """The vector of an :data:`Alignment` (read from its archive when it is a reference ``<archive>:<offset>``;
    any other Kaldi rxfilename through kaldiio)."""
    if not isinstance(value, str):
        return value
    archive, _, offset = value.rpartition(":")
    if not offset.isdigit():
        return np.asarray(kaldiio.load_mat(value), dtype=np.int32)
    with open(archive, "rb") as stream:
        stream.seek(int(offset))
        return read_vector(stream, value)


class StoredAlignments(Mapping):
    """Alignments stored in archives: utterance → vector, each read when it is looked up.

    Where each one is takes one integer an utterance (the archive's number and the offset in it; the
    archives' paths are kept once), not an ``<archive>:<offset>`` string: about 100 bytes an utterance on
    a driver, a quarter of the strings'. :meth:`ref` gives the reference, :attr:`refs` all of them.
    """

    _BITS = 40  # offsets below 1 TB

    def __init__(self, refs: Mapping[str, str] | StoredAlignments | None = None) -> None:
        self._archives: list[str] = []
        self._number: dict[str, int] = {}
        self._where: dict[str, int] = {}
        if refs:
            self.update(refs)

    def update(self, refs: Mapping[str, str] | StoredAlignments | Written | Iterable[tuple[str, str]]) -> None:
        """Add (or replace) references: ``utterance → <archive>:<offset>`` (a mapping or its pairs), another
        store's, or those in written archives' indexes."""
        if isinstance(refs, Written):
            refs = refs.entries()
        if isinstance(refs, StoredAlignments):
            for utt in refs._where:
                self._add(utt, *refs._place(utt))
            return
        for utt, ref in refs.items() if isinstance(refs, Mapping) else refs:
            archive, _, offset = ref.rpartition(":")
            self._add(utt, archive, int(offset))

    def _add(self, utt: str, archive: str, offset: int) -> None:
        number = self._number.get(archive)
        if number is None:
            number = self._number[archive] = len(self._archives)
            self._archives.append(archive)
        self._where[sys.intern(utt)] = number << self._BITS | offset

    def _place(self, utt: str) -> tuple[str, int]:
        """The archive and offset of ``utt``'s vector."""
        where = self._where[utt]
        return self._archives[where >> self._BITS], where & ((1 << self._BITS) - 1)

    def ref(self, utt: str) -> str:
        """Where ``utt``'s vector is: ``<archive>:<offset>``, a Kaldi rxfilename."""
        archive, offset = self._place(utt)
        return f"{archive}:{offset}"

    @property
    def refs(self) -> dict[str, str]:
        """Every utterance's reference (a new dict)."""
        return {utt: self.ref(utt) for utt in self._where}

    def subset(self, utts: Iterable[str]) -> StoredAlignments:
        """The references of those of ``utts`` that have one (what a task is given)."""
        out = StoredAlignments()
        for utt in utts:
            if utt in self._where:
                out._add(utt, *self._place(utt))
        return out

    def __getitem__(self, utt: str) -> np.ndarray:
        return load_alignment(self.ref(utt))

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, utt: object) -> bool:
        return utt in self._where


@dataclass(frozen=True)
class Written:
    """Alignments tasks wrote: the ``.scp`` index of each archive, in shard order. What an aligning task returns
    and a reduction adds up (a concatenation): a path a shard, however many utterances it holds."""

    indexes: tuple[str, ...] = ()

    def __add__(self, other: Written) -> Written:
        return Written(self.indexes + other.indexes)

    def entries(self) -> Iterator[tuple[str, str]]:
        """``(utterance, <archive>:<offset>)`` of every archive, a line at a time."""
        for index in self.indexes:
            yield from scp_entries(index)


def references(alignments: Mapping[str, Alignment] | Written) -> dict[str, Alignment]:
    """What a mapping of alignments holds, without reading any: a store's or written archives' references, else
    the mapping's own values (vectors or references)."""
    if isinstance(alignments, Written):
        return dict(alignments.entries())
    return alignments.refs if isinstance(alignments, StoredAlignments) else dict(alignments)


def shard_alignments(alignments: Mapping[str, np.ndarray], utts: Iterable[str]) -> Mapping[str, Alignment]:
    """What a task is given of the alignments of ``utts`` (those that have one): a store of references when
    ``alignments`` is stored (:class:`StoredAlignments`; the task reads them), else the vectors."""
    if isinstance(alignments, StoredAlignments):
        return alignments.subset(utts)
    return {u: alignments[u] for u in utts if u in alignments}


def write_archive(path: str | Path, alignments: Mapping[str, np.ndarray]) -> dict[str, str]:
    """Write ``alignments`` (sorted by utterance) into the one archive ``path`` and its index
    (:func:`archive_index`); return where each vector is.

    Each is written under a temporary name and renamed, the archive first, so a task that runs twice (a retry, a
    lost worker) leaves one whole archive and index, never a torn one.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = write_ark(path, ((utt, vector_bytes(alignments[utt])) for utt in sorted(alignments)))
    with atomic_text(archive_index(path)) as index:
        index.writelines(line + "\n" for line in lines)
    return dict(line.split(" ", 1) for line in lines)


def archive_index(path: str | Path) -> Path:
    """The ``.scp`` index :func:`write_archive` writes beside archive ``path``."""
    return Path(path).with_suffix(".scp")


def write_alignments(folder: str | Path, tid2pdf: np.ndarray, tid2phone: np.ndarray,
                     alignments: Mapping[str, np.ndarray]) -> None:
    """Write ``alignments`` (transition ids per frame) and the pdfs and phones they map to (``tid2pdf``,
    ``tid2phone``: indexed by transition id) into ``folder``, utterances in sorted order."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tables = {"transition_ids": None, "pdfs": np.asarray(tid2pdf), "phones": np.asarray(tid2phone)}
    names = {kind: f"{folder / kind}.ark" for kind in KINDS}
    with ExitStack() as stack:  # each archive and index renamed into place only when all are written
        arks = {kind: stack.enter_context(atomic_binary(folder / f"{kind}.ark")) for kind in KINDS}
        scps = {kind: stack.enter_context(atomic_text(folder / f"{kind}.scp")) for kind in KINDS}
        for utt in sorted(alignments):
            tids = np.asarray(load_alignment(alignments[utt]), dtype=np.int32)
            for kind, table in tables.items():
                encoded = vector_bytes(tids if table is None else table[tids])
                scps[kind].write(write_entry(arks[kind], utt, encoded, names[kind]) + "\n")


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
    stored = StoredAlignments()
    stored.update(scp_entries(index))  # a line at a time: no table of strings on the way
    return stored
