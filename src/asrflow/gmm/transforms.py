"""Speakers' fMLLR transforms kept on disk while a split is adapted, not on the driver.

A split of 100 h has thousands of speakers, each with a d × (d + 1) transform (12.5 KB at d = 39):
held as arrays they grow the driver with the corpus. :class:`StoredTransforms` appends each new
estimate to one scratch file (raw float64, as Kaldi's ``trans.*`` archives hold a job's transforms)
and keeps only where it is; tasks are given :class:`TransformRef` values and read their speakers'
transforms themselves. A speaker estimated again (a second pass) gets a new entry; the file is
removed when the split is written out.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class TransformRef:
    """Where one transform is: ``rows`` × ``cols`` float64 values at byte ``offset`` of ``path``."""

    path: str
    offset: int
    rows: int
    cols: int

    def load(self) -> np.ndarray:
        return np.fromfile(self.path, dtype=np.float64, count=self.rows * self.cols,
                           offset=self.offset).reshape(self.rows, self.cols)


def matrix(value: np.ndarray | TransformRef) -> np.ndarray:
    """A transform as a task is given it (the matrix, or where it is) as a matrix."""
    return value.load() if isinstance(value, TransformRef) else value


class StoredTransforms(Mapping):
    """speaker → transform, each read from ``path`` when looked up; ``store[spk] = w`` appends ``w``."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_bytes(b"")
        self._where: dict[str, tuple[int, int, int]] = {}

    def __setitem__(self, spk: str, w: np.ndarray) -> None:
        w = np.ascontiguousarray(w, dtype=np.float64)
        with open(self.path, "ab") as out:
            offset = out.seek(0, 2)
            out.write(w.tobytes())
        self._where[spk] = (offset, *w.shape)

    def ref(self, spk: str) -> TransformRef:
        return TransformRef(str(self.path), *self._where[spk])

    def __getitem__(self, spk: str) -> np.ndarray:
        return self.ref(spk).load()

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, spk: object) -> bool:
        return spk in self._where

    def remove(self) -> None:
        """Delete the scratch file (the transforms are then gone)."""
        self.path.unlink(missing_ok=True)
        self._where.clear()


#: Speakers' transforms on the driver: arrays, or stored (a split's, while it is adapted).
Transforms = dict[str, np.ndarray] | StoredTransforms
