"""Feature-space MLLR (fMLLR, constrained MLLR): one affine transform of the features per speaker.

Kaldi's ``gmm-est-fmllr`` for diagonal-covariance GMMs (Gales 1998, "Maximum likelihood
linear transformations for HMM-based speech recognition"): the transform ``W = [A b]`` maps a
frame ``x`` to ``A x + b`` and is chosen to maximise the likelihood of the speaker's frames
under the model, given Gaussian posteriors from an alignment. Its sufficient statistics are the
occupancy ``beta``, ``K = Σ γ Σ⁻¹ μ x̃ᵀ`` (d × (d+1)) and, for each dimension ``i``,
``G_i = Σ γ σ_i⁻² x̃ x̃ᵀ`` ((d+1) × (d+1)), with ``x̃ = [x, 1]``. The auxiliary function

    Q(W) = beta · log|det A| + Σ_i (w_i k_iᵀ − ½ w_i G_i w_iᵀ)

is maximised one row at a time in closed form (each row update cannot lower Q).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from asrflow.gmm.model import GmmModel


class FmllrError(ValueError):
    """Statistics too few or degenerate to estimate a transform from."""


@dataclass
class FmllrStats:
    """fMLLR sufficient statistics of one speaker (add them across utterances with ``+``)."""

    beta: float
    k: np.ndarray  # (d, d+1)
    g: np.ndarray  # (d, d+1, d+1)

    @classmethod
    def zeros(cls, dim: int) -> FmllrStats:
        return cls(0.0, np.zeros((dim, dim + 1)), np.zeros((dim, dim + 1, dim + 1)))

    def __add__(self, other: FmllrStats) -> FmllrStats:
        return FmllrStats(self.beta + other.beta, self.k + other.k, self.g + other.g)


def extend(feats: np.ndarray) -> np.ndarray:
    """``[x, 1]`` for every frame (n, d) → (n, d+1), float64."""
    x = np.asarray(feats, dtype=np.float64)
    return np.hstack([x, np.ones((len(x), 1))])


def gaussian_stats(feats: np.ndarray, post: np.ndarray, means: np.ndarray, invvars: np.ndarray) -> FmllrStats:
    """Statistics of frames ``feats`` (n, d) with posteriors ``post`` (n, M) over Gaussians ``means``,
    ``invvars`` (M, d)."""
    post = np.asarray(post, dtype=np.float64)
    return frame_stats(feats, post @ invvars, post @ (invvars * means), float(post.sum()))


def frame_stats(feats: np.ndarray, w: np.ndarray, u: np.ndarray, beta: float, block: int = 2048) -> FmllrStats:
    """Statistics of frames ``feats`` (n, d) from each frame's ``w`` = Σ_m γ_m σ_m⁻² and ``u`` = Σ_m γ_m σ_m⁻² μ_m
    (both (n, d)) and the total occupancy ``beta``: ``K = uᵀ x̃``, ``G_i = Σ_t w_ti x̃_t x̃_tᵀ`` as one matrix
    product per ``block`` frames (x̃ x̃ᵀ of a block at a time bounds the memory)."""
    xt = extend(feats)
    n, e = xt.shape
    w = np.asarray(w, dtype=np.float64)
    g = np.zeros((w.shape[1], e * e))
    for i in range(0, n, block):
        x = xt[i:i + block]
        g += w[i:i + block].T @ (x[:, :, None] * x[:, None, :]).reshape(len(x), e * e)
    return FmllrStats(beta, np.asarray(u, dtype=np.float64).T @ xt, g.reshape(-1, e, e))


def accumulate(model: GmmModel, feats: list[np.ndarray], pdf_alignments: list[np.ndarray],
               weights: list[np.ndarray] | None = None) -> FmllrStats:
    """Statistics of one speaker's utterances under ``model``, frames assigned to pdfs by
    ``pdf_alignments`` (one pdf id per frame) and to Gaussians by their posteriors within the pdf
    (``gmm-est-fmllr`` given ``ali-to-post``), each frame weighted by ``weights`` if given
    (``weight-silence-post``: silence frames count little). The posteriors give each frame's
    weights per dimension (pdf by pdf); the statistics are then summed over all frames at once."""
    dim = model.am.dim
    if not feats:
        return FmllrStats.zeros(dim)
    x_all = np.concatenate(feats)
    pdfs = np.concatenate(pdf_alignments).astype(np.int64)
    if len(pdfs) != len(x_all):
        raise FmllrError(f"{len(pdfs)} aligned frames for {len(x_all)} feature frames")
    frame_weight = np.concatenate(weights).astype(np.float64) if weights is not None else np.ones(len(pdfs))
    w, u = np.zeros((len(pdfs), dim)), np.zeros((len(pdfs), dim))
    order = np.argsort(pdfs, kind="stable")
    bounds = np.searchsorted(pdfs[order], np.arange(model.am.num_pdfs + 1))
    for pdf in np.flatnonzero(np.diff(bounds)):
        rows = order[bounds[pdf]:bounds[pdf + 1]]
        gmm = model.am.get_pdf(int(pdf))
        ll = np.asarray(gmm.log_likelihoods_matrix(x_all[rows].astype(np.float32)), dtype=np.float64)
        post = np.exp(ll - ll.max(1, keepdims=True))
        post *= (frame_weight[rows] / post.sum(1))[:, None]
        invvars = np.asarray(gmm.inv_vars, dtype=np.float64)
        w[rows] = post @ invvars
        u[rows] = post @ np.asarray(gmm.means_invvars, dtype=np.float64)  # invvars · means
    return frame_stats(x_all, w, u, float(frame_weight.sum()))


def objective(stats: FmllrStats, w: np.ndarray) -> float:
    """The auxiliary function Q(W) per frame (``beta`` · log|det A| + Σ_i w_i k_iᵀ − ½ w_i G_i w_iᵀ) / beta."""
    sign, logdet = np.linalg.slogdet(w[:, :-1])
    if sign == 0:
        return float("-inf")
    quad = np.einsum("ij,ijk,ik->", w, stats.g, w)
    return float((stats.beta * logdet + np.sum(w * stats.k) - 0.5 * quad) / stats.beta)


def estimate(stats: FmllrStats, iterations: int = 10, init: np.ndarray | None = None,
             min_count: float = 50.0) -> np.ndarray:
    """The transform ``W = [A b]`` (d × (d+1)) maximising Q, by Gales' row-by-row update.

    Row ``i`` becomes ``(α c_i + k_i) G_i⁻¹``, with ``c_i`` the ``i``-th row of ``A``'s cofactors
    (here ``A⁻ᵀ``, the same up to a scale α absorbs) and α the root of
    ``α² c G⁻¹ cᵀ + α c G⁻¹ kᵀ − beta = 0`` that gives the larger Q. Fewer than ``min_count``
    frames: an error (Kaldi then keeps the identity; callers decide).
    """
    dim = stats.k.shape[0]
    if stats.beta < min_count:
        raise FmllrError(f"{stats.beta:.1f} frames of statistics, fewer than the {min_count:g} needed")
    w = identity(dim) if init is None else np.array(init, dtype=np.float64)
    g_inv = np.linalg.inv(stats.g)
    for _ in range(iterations):
        for i in range(dim):
            cof = np.append(np.linalg.inv(w[:, :-1]).T[i], 0.0)
            gi, k = g_inv[i], stats.k[i]
            e1, e2 = cof @ gi @ cof, cof @ gi @ k
            disc = np.sqrt(e2 * e2 + 4.0 * e1 * stats.beta)
            best, best_q = None, -np.inf
            for alpha in ((-e2 + disc) / (2 * e1), (-e2 - disc) / (2 * e1)):
                row = (alpha * cof + k) @ gi
                det_part = alpha * e1 + e2  # row · c, proportional to det A
                q = stats.beta * np.log(abs(det_part)) - 0.5 * row @ stats.g[i] @ row + row @ k
                if q > best_q:
                    best, best_q = row, q
            w[i] = best
    return w


def identity(dim: int) -> np.ndarray:
    """The transform that changes nothing, ``[I 0]``."""
    return np.hstack([np.eye(dim), np.zeros((dim, 1))])


def compose(outer: np.ndarray, inner: np.ndarray) -> np.ndarray:
    """The transform that applies ``inner`` then ``outer`` (``compose-transforms``)."""
    return np.hstack([outer[:, :-1] @ inner[:, :-1], (outer[:, :-1] @ inner[:, -1] + outer[:, -1])[:, None]])


def apply(w: np.ndarray, feats: np.ndarray) -> np.ndarray:
    """``A x + b`` for every frame (``transform-feats``), float32."""
    return (extend(feats) @ w.T).astype(np.float32)
