"""LDA+MLLT features: splicing, the saved projection, LDA against scipy's generalised eigenproblem, and MLLT
against a generic optimiser of its objective."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg
import scipy.optimize

from asrflow.features import Projection, splice
from asrflow.gmm.lda import (
    LdaError,
    MlltStats,
    estimate_lda,
    estimate_mllt,
    gmm_features,
    lda_stats,
    mllt_objective,
    mllt_stats,
    transform_means,
)
from asrflow.gmm.model import init_mono, read_topology


def test_splice_repeats_the_edge_frames() -> None:
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    out = splice(x, 1)
    assert out.shape == (4, 9)
    np.testing.assert_array_equal(out[0], np.concatenate([x[0], x[0], x[1]]))
    np.testing.assert_array_equal(out[2], np.concatenate([x[1], x[2], x[3]]))
    np.testing.assert_array_equal(out[3], np.concatenate([x[2], x[3], x[3]]))
    np.testing.assert_array_equal(splice(x, 0), x)


def test_projection_applies_linear_and_affine_matrices_and_round_trips(tmp_path) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((10, 4)).astype(np.float32)
    m = rng.standard_normal((3, 12))
    p = Projection(1, m)
    np.testing.assert_allclose(p(x), splice(x, 1) @ m.T, rtol=1e-4, atol=1e-4)
    affine = Projection(1, np.hstack([m, np.ones((3, 1))]))
    np.testing.assert_allclose(affine(x), splice(x, 1) @ m.T + 1.0, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="cannot project 12-dim"):
        Projection(1, np.ones((3, 7)))(x)
    assert Projection.load(tmp_path) is None
    p.save(tmp_path)
    assert (tmp_path / "splice_opts").read_text().strip() == "--left-context=1 --right-context=1"
    back = Projection.load(tmp_path)
    assert back.context == 1 and back.key != Projection(1, m + 1e-3).key
    np.testing.assert_allclose(back.matrix, m, rtol=1e-6)
    assert gmm_features(tmp_path)["deltas"] == 0 and gmm_features(tmp_path)["projection"].context == 1
    assert gmm_features(tmp_path, adapted=True) == {"deltas": 0, "projection": None}
    assert gmm_features(tmp_path / "none") == {"deltas": 2, "projection": None}


def _classes(rng: np.random.Generator, n: int = 4000, dim: int = 6, classes: int = 5):
    """Frames of ``classes`` Gaussians sharing one correlated covariance."""
    mix = rng.standard_normal((dim, dim))
    means = 3 * rng.standard_normal((classes, dim))
    labels = rng.integers(0, classes, n)
    x = means[labels] + rng.standard_normal((n, dim)) @ mix.T
    return x, labels


def test_lda_solves_the_generalised_eigenproblem() -> None:
    """est-lda: rows are the top generalised eigenvectors of (between, within), scaled to unit within-class
    variance; the silence-weighted frames are left out."""
    rng = np.random.default_rng(1)
    x, labels = _classes(rng)
    weights = np.ones(len(x))
    weights[:100] = 0.0
    stats = lda_stats([x[:2000], x[2000:]], [labels[:2000], labels[2000:]], 5, [weights[:2000], weights[2000:]])
    assert stats.count.sum() == len(x) - 100
    m = estimate_lda(stats, 3)
    kept, lab = x[100:], labels[100:]
    mean = kept.mean(0)
    class_means = np.stack([kept[lab == c].mean(0) for c in range(5)])
    counts = np.bincount(lab, minlength=5)
    between = (class_means - mean).T @ ((class_means - mean) * counts[:, None]) / len(kept)
    within = sum((kept[lab == c] - class_means[c]).T @ (kept[lab == c] - class_means[c]) for c in range(5)) / len(kept)
    values, vectors = scipy.linalg.eigh(between, within)
    np.testing.assert_allclose(m @ within @ m.T, np.eye(3), atol=1e-6)
    np.testing.assert_allclose(np.diag(m @ between @ m.T), values[::-1][:3], rtol=1e-6)
    for row, ref in zip(m, vectors[:, ::-1].T):  # the same directions (up to sign)
        assert abs(abs(row @ within @ ref) - 1.0) < 1e-6
    with pytest.raises(LdaError, match="cannot project 6-dim frames to 7"):
        estimate_lda(stats, 7)


def _mllt_problem(rng: np.random.Generator, dim: int = 4) -> MlltStats:
    g = np.stack([(lambda b: b @ b.T + dim * np.eye(dim))(rng.standard_normal((dim, dim))) for _ in range(dim)])
    return MlltStats(1000.0, 250.0 * g)


def test_mllt_reaches_the_optimum_of_its_objective() -> None:
    """est-mllt's row updates end where a generic optimiser of the same objective ends."""
    stats = _mllt_problem(np.random.default_rng(2))
    a = estimate_mllt(stats, iterations=200)
    dim = a.shape[0]
    best = scipy.optimize.minimize(lambda v: -mllt_objective(stats, v.reshape(dim, dim)), np.eye(dim).ravel(),
                                   method="BFGS", options={"gtol": 1e-10, "maxiter": 5000})
    assert mllt_objective(stats, a) == pytest.approx(-best.fun, abs=1e-6)
    assert mllt_objective(stats, a) > mllt_objective(stats, np.eye(dim))


def test_mllt_statistics_and_mean_transform(tmp_path) -> None:
    """One Gaussian on correlated data: MLLT alternated with the variance update decorrelates it (A Σ Aᵀ near
    diagonal, Gales' semi-tied covariance), and moving the means by A keeps each where its transformed frames are."""
    rng = np.random.default_rng(3)
    dim = 3
    (tmp_path / "topo").write_text(TOPO)
    model = init_mono(read_topology(tmp_path / "topo"), np.ones(dim), np.array([4.0, 2.0, 1.0]))
    cov = np.array([[4.0, 1.5, 0.5], [1.5, 2.0, 0.3], [0.5, 0.3, 1.0]])
    x = rng.multivariate_normal(np.ones(dim), cov, 20000)
    stats = mllt_stats(model, [x], [np.zeros(len(x), dtype=np.int64)])
    assert stats.beta == pytest.approx(len(x))
    for _ in range(20):
        a = estimate_mllt(stats)
        variances = ((x - x.mean(0)) @ a.T).var(0)
        stats = MlltStats(stats.beta, np.einsum("k,ij->kij", 1.0 / variances, np.cov(x.T, bias=True) * len(x)))
    c = a @ cov @ a.T
    assert np.abs(c - np.diag(np.diag(c))).max() < 0.05 * np.diag(c).min()
    transform_means(model, a)
    gmm = model.am.get_pdf(0)
    np.testing.assert_allclose(np.asarray(gmm.means_invvars) / np.asarray(gmm.inv_vars), (a @ np.ones(dim))[None],
                               rtol=1e-5)


TOPO = """<Topology>
<TopologyEntry>
<ForPhones>
1
</ForPhones>
<State> 0 <PdfClass> 0 <Transition> 0 0.5 <Transition> 1 0.5 </State>
<State> 1 </State>
</TopologyEntry>
</Topology>
"""
