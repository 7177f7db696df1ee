"""What consumers apply on load: CMVN (Kaldi ``apply-cmvn``), deltas (``add-deltas``), and spliced frames
through a linear transform (``splice-feats | transform-feats``, the LDA+MLLT systems).

Stored features are static (13 MFCC, or log-mel); CMVN comes first, then Δ/ΔΔ or the spliced
projection, as in Kaldi recipes, so each model can choose its own transform of the same archives.
"""

from __future__ import annotations

import functools
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np


def cmvn_stats(feats: np.ndarray) -> np.ndarray:
    """Kaldi CMVN statistics of one matrix: shape (2, dim + 1), float64.

    Row 0 holds the sum of each dimension and the frame count; row 1 the sum of squares.
    """
    stats = np.zeros((2, feats.shape[1] + 1), dtype=np.float64)
    f = feats.astype(np.float64)
    stats[0, :-1] = f.sum(axis=0)
    stats[1, :-1] = (f * f).sum(axis=0)
    stats[0, -1] = feats.shape[0]
    return stats


def apply_cmvn(feats: np.ndarray, stats: np.ndarray | None, norm_vars: bool = False) -> np.ndarray:
    """Normalise ``feats`` with Kaldi CMVN ``stats`` (mean; variance too if ``norm_vars``); ``stats`` None:
    the matrix's own statistics (per-utterance CMVN)."""
    if stats is None:
        stats = cmvn_stats(feats)
    count = stats[0, -1]
    if count < 1:
        raise ValueError("CMVN statistics have no frames")
    mean = stats[0, :-1] / count
    out = feats - mean
    if norm_vars:
        var = np.maximum(stats[1, :-1] / count - mean * mean, 1e-10)
        out = out / np.sqrt(var)
    return out.astype(np.float32)


@functools.lru_cache(maxsize=8)
def delta_scales(order: int, window: int) -> tuple[np.ndarray, ...]:
    """Kaldi's delta filter for each order 0..``order`` (order 0 is [1])."""
    scales = [np.array([1.0])]
    normalizer = sum(j * j for j in range(-window, window + 1))
    for _ in range(order):
        prev = scales[-1]
        cur = np.zeros(prev.size + 2 * window)
        for j in range(-window, window + 1):
            cur[j + window : j + window + prev.size] += j * prev
        scales.append(cur / normalizer)
    return tuple(scales)


def add_deltas(feats: np.ndarray, order: int = 2, window: int = 2) -> np.ndarray:
    """Append Δ (and ΔΔ, ...) like Kaldi ``add-deltas``: edge frames are repeated."""
    frames = feats.shape[0]
    out = [feats.astype(np.float32)]
    for scale in delta_scales(order, window)[1:]:
        half = (scale.size - 1) // 2
        padded = np.concatenate([np.repeat(feats[:1], half, 0), feats, np.repeat(feats[-1:], half, 0)])
        acc = np.zeros_like(feats, dtype=np.float64)
        for i, w in enumerate(scale):
            if w:
                acc += w * padded[i : i + frames]
        out.append(acc.astype(np.float32))
    return np.concatenate(out, axis=1)


def splice(feats: np.ndarray, context: int) -> np.ndarray:
    """Each frame with its ``context`` neighbours on either side, concatenated (Kaldi ``splice-feats``;
    edge frames are repeated): (frames, dim) → (frames, (2 · context + 1) · dim)."""
    frames = feats.shape[0]
    padded = np.concatenate([np.repeat(feats[:1], context, 0), feats, np.repeat(feats[-1:], context, 0)])
    return np.concatenate([padded[i: i + frames] for i in range(2 * context + 1)], axis=1)


@dataclass(frozen=True, eq=False)
class Projection:
    """Spliced frames through a matrix (``splice-feats --left-context=c --right-context=c | transform-feats``).

    ``matrix``: (out, (2 · context + 1) · dim), or with one more column, an affine transform whose
    last column is the offset. Saved in a model's folder as Kaldi saves it: ``final.mat`` (a Kaldi
    binary matrix) and ``splice_opts``.
    """

    context: int
    matrix: np.ndarray

    def __call__(self, feats: np.ndarray) -> np.ndarray:
        x = splice(np.asarray(feats, dtype=np.float32), self.context)
        m = np.asarray(self.matrix, dtype=np.float32)
        if m.shape[1] == x.shape[1] + 1:
            return np.ascontiguousarray(x @ m[:, :-1].T + m[:, -1])
        if m.shape[1] != x.shape[1]:
            raise ValueError(f"a {m.shape[0]} x {m.shape[1]} transform cannot project {x.shape[1]}-dim spliced frames")
        return np.ascontiguousarray(x @ m.T)

    @property
    def key(self) -> str:
        """A short identity (the matrix changes while MLLT is estimated; cached features must follow)."""
        return f"{self.context}-{zlib.crc32(np.ascontiguousarray(self.matrix, dtype=np.float64).tobytes()):08x}"

    def save(self, folder: str | Path) -> None:
        """Write ``final.mat`` and ``splice_opts`` into ``folder``."""
        import kaldiio

        folder = Path(folder)
        kaldiio.save_mat(str(folder / "final.mat"), np.asarray(self.matrix, dtype=np.float32))
        (folder / "splice_opts").write_text(f"--left-context={self.context} --right-context={self.context}\n")

    @classmethod
    def load(cls, folder: str | Path) -> Projection | None:
        """The projection saved in ``folder``, or None when it has none (a Δ+ΔΔ system)."""
        import kaldiio

        folder = Path(folder)
        if not (folder / "final.mat").is_file():
            return None
        opts = dict(o.lstrip("-").split("=") for o in (folder / "splice_opts").read_text().split())
        if opts["left-context"] != opts["right-context"]:
            raise ValueError(f"{folder / 'splice_opts'}: only symmetric contexts are supported")
        return cls(int(opts["left-context"]), np.asarray(kaldiio.load_mat(str(folder / "final.mat"))))
