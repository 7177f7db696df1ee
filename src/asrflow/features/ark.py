"""Kaldi binary archives (``ark``) and their index (``scp``), readable by kaldiio and Kaldi.

A float matrix is written as ``<key> \\0B FM \\4<rows:int32>\\4<cols:int32><float32 data>``
(``DM`` and float64 for double matrices), or compressed as Kaldi's ``copy-feats --compress``
writes it (``CM``: one byte a value with per-column quantiles, about a quarter of the size);
the ``scp`` line ``<key> <ark>:<offset>`` points at the ``\\0B`` marker. Archives are written
to a temporary name and renamed into place, so a crashed writer never leaves a half archive
under the final name.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

import numpy as np

from asrflow.data.tables import atomic_binary, atomic_text, entries

SPEECH_FEATURE = 2  # Kaldi's CompressionMethod kSpeechFeature: what make_mfcc.sh --compress true stores


def matrix_bytes(matrix: np.ndarray, compress: bool = False) -> bytes:
    """Kaldi's binary encoding of a 2-D float32 (``FM``) or float64 (``DM``) matrix; ``compress``: Kaldi's
    compressed matrix for speech features (through kaldiio)."""
    if matrix.ndim != 2:
        raise ValueError(f"expected a matrix, got shape {matrix.shape}")
    if compress:
        from kaldiio.matio import write_array

        buffer = io.BytesIO()
        write_array(buffer, np.asarray(matrix, dtype=np.float32), compression_method=SPEECH_FEATURE)
        return buffer.getvalue()
    if matrix.dtype == np.float64:
        tag, data = b"DM ", np.ascontiguousarray(matrix, dtype="<f8")
    else:
        tag, data = b"FM ", np.ascontiguousarray(matrix, dtype="<f4")
    rows, cols = data.shape
    return b"\0B" + tag + b"\x04" + struct.pack("<i", rows) + b"\x04" + struct.pack("<i", cols) + data.tobytes()


def decoded(encoded: bytes) -> np.ndarray:
    """The matrix a :func:`matrix_bytes` encoding holds (what a reader of the archive gets)."""
    from kaldiio.matio import read_kaldi

    return np.asarray(read_kaldi(io.BytesIO(encoded)))


def write_entry(out: BinaryIO, key: str, encoded: bytes, name: str) -> str:
    """Write one ``<key> <encoded object>`` entry to the archive ``out`` (called ``name`` in the index); return its
    scp line."""
    if not key or any(c.isspace() for c in key):
        raise ValueError(f"ark key {key!r} is empty or has whitespace")
    out.write(key.encode("utf-8") + b" ")
    line = f"{key} {name}:{out.tell()}"
    out.write(encoded)
    return line


def write_ark(path: str | Path, items: Iterable[tuple[str, np.ndarray | bytes]],
              scp_name: str | None = None, compress: bool = False) -> list[str]:
    """Write ``(key, matrix)`` pairs to ``path`` atomically; return the scp lines.

    A matrix may come already encoded (bytes of :func:`matrix_bytes`); ``compress``: the others are
    written compressed. ``scp_name`` is the archive name written into the scp lines (default: ``str(path)``).
    """
    path = Path(path)
    name = scp_name or str(path)
    with atomic_binary(path) as out:
        lines = [write_entry(out, key, matrix if isinstance(matrix, bytes) else matrix_bytes(matrix, compress), name)
                 for key, matrix in items]
    return lines


def write_text_atomic(path: str | Path, lines: Iterable[str]) -> None:
    """Write lines (newline-terminated) to ``path`` via a temporary file, a line at a time."""
    with atomic_text(path) as out:
        out.writelines(f"{line}\n" for line in lines)


def scp_entries(path: str | Path) -> Iterator[tuple[str, str]]:
    """The ``(key, ark:offset)`` entries of an scp file, read a line at a time."""
    return entries(path)


def read_scp(path: str | Path) -> dict[str, str]:
    """``key → ark:offset`` from an scp file."""
    return dict(scp_entries(path))


def load(value: str) -> np.ndarray:
    """Load one matrix from an scp value ``<ark>:<offset>`` (via kaldiio)."""
    import kaldiio

    return np.asarray(kaldiio.load_mat(value))


def iter_scp(path: str | Path) -> Iterator[tuple[str, np.ndarray]]:
    """Iterate ``(key, matrix)`` over an scp file in file order."""
    for key, value in read_scp(path).items():
        yield key, load(value)
