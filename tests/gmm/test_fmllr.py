"""fMLLR: recovers a known affine distortion, never lowers its objective, and the model path
accumulates the same statistics as the direct one."""

from types import SimpleNamespace

import numpy as np
import pytest

from asrflow.gmm import fmllr
from asrflow.gmm.model import single_gaussian
from asrflow.kaldi import khg


def mixture(rng, components=8, dim=4):
    means = rng.normal(0, 3, (components, dim))
    variances = rng.uniform(0.3, 1.5, (components, dim))
    return means, variances


def sample(rng, means, variances, frames):
    comp = rng.integers(0, len(means), frames)
    x = means[comp] + rng.normal(size=(frames, means.shape[1])) * np.sqrt(variances[comp])
    return x, np.eye(len(means))[comp]


def one_gaussian_pdfs(means, variances):
    """A model (only its ``am``) whose pdf i is the single Gaussian i."""
    am = khg.AmDiagGmm()
    for m, v in zip(means, variances):
        am.add_pdf(single_gaussian(m, v))
    return SimpleNamespace(am=am)


def distortion(rng, dim):
    a = np.eye(dim) + 0.3 * rng.normal(size=(dim, dim))
    return a, rng.normal(0, 1, dim)


def test_recovers_the_inverse_of_a_known_distortion():
    rng = np.random.default_rng(0)
    means, variances = mixture(rng)
    x, post = sample(rng, means, variances, 20000)
    a, b = distortion(rng, 4)
    y = (x - b) @ np.linalg.inv(a).T  # the speaker's features: x = A y + b
    stats = fmllr.gaussian_stats(y, post, means, 1 / variances)
    w = fmllr.estimate(stats, iterations=20)
    np.testing.assert_allclose(w[:, :-1], a, atol=0.05)
    np.testing.assert_allclose(w[:, -1], b, atol=0.05)
    np.testing.assert_allclose(fmllr.apply(w, y), x, atol=0.2)


def test_each_iteration_keeps_or_raises_the_objective():
    rng = np.random.default_rng(1)
    means, variances = mixture(rng, 6, 5)
    x, post = sample(rng, means, variances, 3000)
    a, b = distortion(rng, 5)
    stats = fmllr.gaussian_stats((x - b) @ np.linalg.inv(a).T, post, means, 1 / variances)
    w = np.hstack([np.eye(5), np.zeros((5, 1))])
    values = [fmllr.objective(stats, w)]
    for _ in range(6):
        w = fmllr.estimate(stats, iterations=1, init=w)
        values.append(fmllr.objective(stats, w))
    assert all(b >= a - 1e-9 for a, b in zip(values, values[1:]))
    assert values[-1] > values[0] + 0.5


def test_matched_features_keep_nearly_the_identity():
    rng = np.random.default_rng(2)
    means, variances = mixture(rng)
    x, post = sample(rng, means, variances, 20000)
    w = fmllr.estimate(fmllr.gaussian_stats(x, post, means, 1 / variances))
    np.testing.assert_allclose(w, np.hstack([np.eye(4), np.zeros((4, 1))]), atol=0.05)


def test_too_few_frames_is_an_error():
    rng = np.random.default_rng(3)
    means, variances = mixture(rng)
    x, post = sample(rng, means, variances, 20)
    with pytest.raises(fmllr.FmllrError, match="fewer than the 50"):
        fmllr.estimate(fmllr.gaussian_stats(x, post, means, 1 / variances))


def test_model_statistics_use_the_posteriors_within_each_aligned_pdf():
    rng = np.random.default_rng(4)
    means, variances = mixture(rng, 2, 3)
    x, post = sample(rng, means, variances, 500)
    pdfs = post.argmax(1)
    halves = [x[:200], x[200:]], [pdfs[:200], pdfs[200:]]
    got = fmllr.accumulate(one_gaussian_pdfs(means, variances), *halves)
    want = fmllr.gaussian_stats(x, post, means, 1 / variances)
    assert got.beta == pytest.approx(want.beta)
    np.testing.assert_allclose(got.k, want.k, rtol=1e-4)
    np.testing.assert_allclose(got.g, want.g, rtol=1e-4)


def test_compose_applies_the_inner_transform_first():
    rng = np.random.default_rng(5)
    inner, outer = rng.normal(size=(3, 4)), rng.normal(size=(3, 4))
    x = rng.normal(size=(10, 3))
    np.testing.assert_allclose(fmllr.apply(fmllr.compose(outer, inner), x),
                               fmllr.apply(outer, fmllr.apply(inner, x)), rtol=1e-4, atol=1e-4)


def test_frame_weights_scale_the_statistics():
    rng = np.random.default_rng(6)
    means, variances = mixture(rng, 2, 3)
    x, post = sample(rng, means, variances, 100)
    weights = np.where(np.arange(100) < 50, 1.0, 0.01)
    got = fmllr.accumulate(one_gaussian_pdfs(means, variances), [x], [post.argmax(1)], [weights])
    want = fmllr.gaussian_stats(x, post * weights[:, None], means, 1 / variances)
    assert got.beta == pytest.approx(50 + 0.5)
    np.testing.assert_allclose(got.g, want.g, rtol=1e-4)
