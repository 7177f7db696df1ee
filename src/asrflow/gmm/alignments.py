"""Frame alignments as Kaldi binary archives of int32 vectors, read lazily.

An alignment folder (``ali/``) holds three archives, each with its ``.scp`` index::

    transition_ids.ark  the forced alignment itself (Kaldi's ali.*.gz)
    pdfs.ark            the pdf of every frame (ali-to-pdf)
    phones.ark          the phone of every frame, ids of the lang's phones.txt (ali-to-phones --per-frame)

Kaldi's own tools read them (``copy-int-vector scp:ali/pdfs.scp ark,t:-`` prints them as
text). Readers get a mapping that loads one utterance's vector when asked for it through the
``.scp`` offsets, so no stage holds a whole corpus's alignments to read a few of them, and a
shard's worth is 4 bytes a frame.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import kaldiio
import numpy as np

#: The archives of an alignment folder.
KINDS = ("transition_ids", "pdfs", "phones")


def write_alignments(folder: str | Path, tid2pdf: np.ndarray, tid2phone: np.ndarray,
                     alignments: Mapping[str, np.ndarray]) -> None:
    """Write ``alignments`` (transition ids per frame) and the pdfs and phones they map to (``tid2pdf``,
    ``tid2phone``: indexed by transition id) into ``folder``, utterances in sorted order."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    writers = {kind: kaldiio.WriteHelper(f"ark,scp:{folder / kind}.ark,{folder / kind}.scp") for kind in KINDS}
    try:
        for utt in sorted(alignments):
            tids = np.asarray(alignments[utt], dtype=np.int32)
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


def read_alignments(folder: str | Path, kind: str = "transition_ids") -> Mapping[str, np.ndarray]:
    """Archive ``kind`` of alignment folder ``folder`` as a mapping utterance → int32 vector, each vector read
    from the archive when it is looked up."""
    index = alignment_index(folder, kind)
    if not index.is_file():
        raise FileNotFoundError(f"no {kind} alignments in {folder} ({index.name} is missing)")
    return kaldiio.load_scp(str(index))
