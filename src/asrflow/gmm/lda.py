"""LDA+MLLT features (Kaldi's ``train_lda_mllt.sh``): spliced frames projected by LDA, then by MLLT.

CMVN-normalised MFCCs are spliced over ±``context`` frames (7 × 13 = 91 dims) and projected to
``dim`` (40) by linear discriminant analysis with the source system's pdfs as classes
(``acc-lda`` / ``est-lda``; silence frames left out). While the triphone system trains on the
projected features, a maximum-likelihood linear transform (MLLT, Gales' semi-tied covariance)
is estimated a few times from its Gaussian posteriors (``gmm-acc-mllt`` / ``est-mllt``): it
rotates the feature space so that the diagonal covariances fit it better; the model's means are
moved with it (``gmm-transform-means``) and it is composed onto the projection
(``compose-transforms``), which the system's folder keeps as ``final.mat``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from asrflow.features.transforms import Projection

if TYPE_CHECKING:
    from asrflow.gmm.model import GmmModel


class LdaError(ValueError):
    """Statistics too few or degenerate to estimate a transform from."""


@dataclass
class LdaStats:
    """Per-class counts and sums and the total scatter of spliced frames (add them with ``+``)."""

    count: np.ndarray  # (classes,)
    sums: np.ndarray  # (classes, dim)
    scatter: np.ndarray  # (dim, dim): Σ x xᵀ

    @classmethod
    def zeros(cls, classes: int, dim: int) -> LdaStats:
        return cls(np.zeros(classes), np.zeros((classes, dim)), np.zeros((dim, dim)))

    def __add__(self, other: LdaStats) -> LdaStats:
        return LdaStats(self.count + other.count, self.sums + other.sums, self.scatter + other.scatter)


def lda_stats(feats: list[np.ndarray], classes: list[np.ndarray], num_classes: int,
              weights: list[np.ndarray] | None = None) -> LdaStats:
    """Statistics of frames ``feats`` labelled with ``classes`` (one class per frame, e.g. its aligned pdf);
    a frame of weight 0 (``weight-silence-post 0``) is left out."""
    dim = feats[0].shape[1] if feats else 0
    stats = LdaStats.zeros(num_classes, dim)
    if not feats:
        return stats
    x = np.concatenate(feats).astype(np.float64)
    c = np.concatenate(classes).astype(np.int64)
    w = np.concatenate(weights).astype(np.float64) if weights is not None else np.ones(len(c))
    if len(c) != len(x):
        raise LdaError(f"{len(c)} labelled frames for {len(x)} feature frames")
    keep = w > 0
    x, c, w = x[keep], c[keep], w[keep]
    stats.count += np.bincount(c, weights=w, minlength=num_classes)
    np.add.at(stats.sums, c, x * w[:, None])
    stats.scatter += (x * w[:, None]).T @ x
    return stats


def estimate_lda(stats: LdaStats, dim: int) -> np.ndarray:
    """The LDA projection (``dim`` × input dim) of ``est-lda``: the within-class covariance is made the identity
    (through its Cholesky factor), and the directions of largest between-class variance are kept, largest
    first. The projected features have unit within-class variance."""
    total = stats.count.sum()
    if total <= 0:
        raise LdaError("no frames to estimate LDA from")
    if dim > stats.sums.shape[1]:
        raise LdaError(f"cannot project {stats.sums.shape[1]}-dim frames to {dim} dimensions")
    mean = stats.sums.sum(0) / total
    used = stats.count > 0
    class_means = stats.sums[used] / stats.count[used, None]
    between = (class_means * stats.count[used, None]).T @ class_means / total - np.outer(mean, mean)
    within = stats.scatter / total - np.outer(mean, mean) - between
    try:
        chol = np.linalg.cholesky(within + 1e-10 * np.trace(within) / len(within) * np.eye(len(within)))
    except np.linalg.LinAlgError as exc:
        raise LdaError(f"the within-class covariance is not positive definite ({exc})") from None
    inv_chol = np.linalg.inv(chol)
    values, vectors = np.linalg.eigh(inv_chol @ between @ inv_chol.T)
    top = np.argsort(values)[::-1][:dim]
    return vectors[:, top].T @ inv_chol


@dataclass
class MlltStats:
    """``gmm-acc-mllt`` statistics: the count and, per output dimension ``i``,
    ``G_i = Σ_t Σ_m γ_m(t) / σ²_{m,i} (x_t − μ_m)(x_t − μ_m)ᵀ``."""

    beta: float
    g: np.ndarray  # (dim, dim, dim)

    @classmethod
    def zeros(cls, dim: int) -> MlltStats:
        return cls(0.0, np.zeros((dim, dim, dim)))

    def __add__(self, other: MlltStats) -> MlltStats:
        return MlltStats(self.beta + other.beta, self.g + other.g)


def mllt_stats(model: GmmModel, feats: list[np.ndarray], pdf_alignments: list[np.ndarray],
               weights: list[np.ndarray] | None = None) -> MlltStats:
    """Statistics of frames aligned to pdfs (Gaussian posteriors within each pdf), each frame weighted
    by ``weights`` if given (silence: 0)."""
    dim = model.am.dim
    stats = MlltStats.zeros(dim)
    if not feats:
        return stats
    x_all = np.concatenate(feats).astype(np.float64)
    pdfs = np.concatenate(pdf_alignments).astype(np.int64)
    w_all = np.concatenate(weights).astype(np.float64) if weights is not None else np.ones(len(pdfs))
    keep = w_all > 0
    x_all, pdfs, w_all = x_all[keep], pdfs[keep], w_all[keep]
    for pdf in np.unique(pdfs):
        rows = pdfs == pdf
        xp = x_all[rows]
        gmm = model.am.get_pdf(int(pdf))
        ll = np.asarray(gmm.log_likelihoods_matrix(xp.astype(np.float32)), dtype=np.float64)
        post = np.exp(ll - ll.max(1, keepdims=True))
        post *= (w_all[rows] / post.sum(1))[:, None]
        invvars = np.asarray(gmm.inv_vars, dtype=np.float64)
        means = np.asarray(gmm.means_invvars, dtype=np.float64) / invvars
        for m in range(len(means)):
            gamma = post[:, m]
            if gamma.sum() < 1e-10:
                continue
            y = xp - means[m]
            scatter = (y * gamma[:, None]).T @ y
            stats.g += invvars[m][:, None, None] * scatter[None]
        stats.beta += float(post.sum())
    return stats


def mllt_objective(stats: MlltStats, a: np.ndarray) -> float:
    """The auxiliary function per frame: ``log|det A| − ½ Σ_i a_i G_i a_iᵀ / beta``."""
    _, logdet = np.linalg.slogdet(a)
    return float(logdet - 0.5 * np.einsum("ij,ijk,ik->", a, stats.g, a) / stats.beta)


def estimate_mllt(stats: MlltStats, iterations: int = 100) -> np.ndarray:
    """The MLLT matrix ``A`` (``est-mllt``): rows updated one at a time in closed form from the identity,
    ``a_i = c_i G_i⁻¹ · sqrt(beta / (c_i G_i⁻¹ c_iᵀ))`` with ``c_i`` the ``i``-th row of ``A``'s cofactors;
    no update lowers the objective."""
    dim = stats.g.shape[0]
    if stats.beta <= dim:
        raise LdaError(f"{stats.beta:.1f} frames of statistics are too few for a {dim}-dim MLLT")
    g_inv = np.linalg.inv(stats.g)
    a = np.eye(dim)
    for _ in range(iterations):
        for i in range(dim):
            cof = np.linalg.inv(a).T[i]
            row = cof @ g_inv[i]
            a[i] = row * np.sqrt(stats.beta / (row @ cof))
    return a


def transform_means(model: GmmModel, a: np.ndarray) -> None:
    """Move every Gaussian's mean by ``A`` (``gmm-transform-means``), the variances kept (the next M-step
    re-estimates them in the rotated space)."""
    from asrflow.kaldi import khg

    for pdf in range(model.am.num_pdfs):
        gmm = model.am.get_pdf(pdf)
        invvars = np.asarray(gmm.inv_vars, dtype=np.float64)
        means = np.asarray(gmm.means_invvars, dtype=np.float64) / invvars
        new = khg.DiagGmm(nmix=gmm.num_gauss, dim=gmm.dim)
        new.set_weights(np.asarray(gmm.weights, dtype=np.float32))
        new.set_invvars_and_means(invvars.astype(np.float32), (means @ a.T).astype(np.float32))
        new.compute_gconsts()
        gmm.copy_from_diag_gmm(new)


def silence_weights(model: GmmModel, alignment: np.ndarray, silence: set[int]) -> np.ndarray:
    """Weight of each aligned frame: 0 on the silence phones, else 1 (``weight-silence-post 0``)."""
    phone_of, _ = model.tid_tables
    return np.where(np.isin(phone_of[alignment], list(silence)), 0.0, 1.0)


def gmm_features(model_dir: str | Path, adapted: bool = False) -> dict[str, Any]:
    """How a GMM system's features are read (keyword arguments of
    :func:`~asrflow.gmm.shards.split_shards`): spliced frames through the projection its folder keeps
    (LDA+MLLT systems), else Δ+ΔΔ MFCCs; ``adapted``: the fmllr stage's features, used as they are."""
    if adapted:
        return {"deltas": 0, "projection": None}
    projection = Projection.load(model_dir)
    return {"deltas": 0 if projection is not None else 2, "projection": projection}
