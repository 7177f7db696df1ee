"""What consumers apply on load: CMVN (Kaldi ``apply-cmvn``) and deltas (``add-deltas``).

Stored features are static (13 MFCC, or log-mel); CMVN comes first, then Δ/ΔΔ, as in
Kaldi recipes, so each model can choose its own transform of the same archives.
"""

from __future__ import annotations

import functools

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
