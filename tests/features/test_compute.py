"""Features against the Kaldi-compatible reference (kaldi-native-fbank) and Kaldi's formulas."""

from __future__ import annotations

import numpy as np
import pytest

from asrflow.data.audio import read_audio
from asrflow.features import FeatureOptions, add_deltas, apply_cmvn, cmvn_stats, compute, compute_batch
from asrflow.features.bench import kaldi_native_fbank
from asrflow.features.compute import dither_noise, num_frames

from ..conftest import tone

pytest.importorskip("kaldi_native_fbank")


def reference(samples: np.ndarray, opts: FeatureOptions) -> np.ndarray:
    return kaldi_native_fbank(opts)(samples.tolist())


CASES = [
    dict(kind="mfcc", sample_rate=8000, num_mel_bins=23, num_ceps=13),
    dict(kind="mfcc", sample_rate=16000, num_mel_bins=40, num_ceps=20, snip_edges=False, window="hamming"),
    dict(kind="fbank", sample_rate=8000, num_mel_bins=40, use_energy=False),
    dict(kind="fbank", sample_rate=16000, num_mel_bins=80, use_energy=True, snip_edges=False, high_freq=-400.0),
    dict(kind="fbank", sample_rate=16000, num_mel_bins=80, use_energy=False, window="hanning", preemphasis=0.0),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(f"{v}" for v in c.values()))
def test_matches_kaldi_native_fbank(case: dict, mirror) -> None:
    if case["sample_rate"] == 8000:
        samples, _ = read_audio(str(mirror / "fsdd" / "recordings" / "3_jackson_7.wav"))
    else:
        # Broadband 16 kHz signal: resampled 8 kHz speech leaves the upper bands empty, where
        # log(power) is float32 round-off noise in both implementations.
        rng = np.random.default_rng(3)
        t = np.arange(16000) / 16000
        samples = (0.2 * np.sin(2 * np.pi * (200 + 3000 * t) * t) + 0.05 * rng.standard_normal(t.size))
    samples = (samples * 32768.0).astype(np.float32)
    opts = FeatureOptions(dither=0.0, **case)
    ours, ref = compute(samples, opts), reference(samples, opts)
    assert ours.shape == ref.shape
    # float32 arithmetic in a different order: agreement to ~1e-4 absolute on log values.
    assert np.abs(ours - ref).max() < 2e-3
    assert np.corrcoef(ours.ravel(), ref.ravel())[0, 1] > 0.99999


def test_frame_counts_match_kaldi() -> None:
    opts = FeatureOptions(kind="mfcc", sample_rate=8000)
    assert [num_frames(n, opts) for n in (199, 200, 279, 280, 8000)] == [0, 1, 1, 2, 98]
    edges = FeatureOptions(kind="mfcc", sample_rate=8000, snip_edges=False)
    assert num_frames(8000, edges) == 100


def test_batch_equals_one_by_one_and_dither_is_seeded() -> None:
    opts = FeatureOptions(kind="fbank", sample_rate=8000, num_mel_bins=40, dither=1.0, use_energy=False)
    signals = [tone(s, seed=i) * 32768 for i, s in enumerate((0.3, 1.7, 0.02, 0.9))]
    ids = ["a", "b", "c", "d"]
    batch = compute_batch(signals, opts, ids, seed=7)
    single = [compute(s, opts, u, seed=7) for s, u in zip(signals, ids)]
    assert batch[2].shape == (0, 40)
    for x, y in zip(batch, single):  # bit for bit: the block is processed in float64
        np.testing.assert_array_equal(x, y)
    other_seed = compute(signals[0], opts, "a", seed=8)
    assert not np.array_equal(other_seed, single[0])


def test_features_do_not_depend_on_the_blas_thread_count(mirror) -> None:
    """Snakemake sets OPENBLAS_NUM_THREADS to a job's threads; a 2-thread GEMM rounded yesno's
    silence frames differently (log-mel up to 1.2e-3 apart). compute_batch pins BLAS to one thread."""
    from threadpoolctl import threadpool_limits

    wavs = sorted((mirror / "yesno" / "waves_yesno").glob("0_*.wav"))[:16]
    signals = [read_audio(str(w))[0].astype(np.float32) * 32768 for w in wavs]
    opts = FeatureOptions(kind="fbank", sample_rate=8000, num_mel_bins=40, dither=0.0)
    results = []
    for threads in (1, 2):
        with threadpool_limits(limits=threads, user_api="blas"):
            results.append(compute_batch(signals, opts))
    for one, two in zip(*results):
        np.testing.assert_array_equal(one, two)


@pytest.mark.parametrize("kind", ["mfcc", "fbank"])
def test_an_utterance_s_features_do_not_depend_on_its_batch(mirror, kind: str) -> None:
    """In float32 the BLAS kernels rounded a row by where it fell in the block: FSDD features computed
    alone and in a batch of 60 were up to 6.8e-5 apart (all 60 differed). Adding utterances to a
    shard (e.g. speed-perturbed copies) must not change the others' features."""
    wavs = sorted((mirror / "fsdd" / "recordings").glob("*_nicolas_*.wav"))[:60]
    signals = [read_audio(str(w))[0].astype(np.float32) * 32768 for w in wavs]
    opts = FeatureOptions(kind=kind, sample_rate=8000, dither=0.0)
    batched = compute_batch(signals, opts)
    for signal, features in zip(signals, batched):
        np.testing.assert_array_equal(compute(signal, opts), features)


def test_dither_noise_is_gaussian_and_keyed() -> None:
    a, b = dither_noise("utt-a", 50000, 0), dither_noise("utt-b", 50000, 0)
    assert abs(float(a.mean())) < 0.02 and abs(float(a.std()) - 1) < 0.02
    assert abs(float(np.corrcoef(a, b)[0, 1])) < 0.02
    np.testing.assert_array_equal(a, dither_noise("utt-a", 50000, 0))
    assert not np.array_equal(a, dither_noise("utt-a", 50000, 1))
    assert dither_noise("x", 3 << 20, 0).size == 3 << 20  # longer than the table: wraps


def test_deltas_follow_kaldi_formula() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((12, 3)).astype(np.float32)
    out = add_deltas(x, order=2, window=2)
    assert out.shape == (12, 9)
    padded = np.concatenate([x[:1], x[:1], x, x[-1:], x[-1:]])
    delta = sum(j * padded[2 + j : 2 + j + 12] for j in range(-2, 3)) / 10.0
    np.testing.assert_allclose(out[:, 3:6], delta, rtol=1e-5, atol=1e-6)
    # ΔΔ is the delta filter applied twice (Kaldi convolves the scales).
    padded_d = np.concatenate([np.repeat(x[:1], 4, 0), x, np.repeat(x[-1:], 4, 0)])
    scales = np.convolve(np.arange(-2, 3) / 10.0, np.arange(-2, 3) / 10.0)
    dd = sum(w * padded_d[i : i + 12] for i, w in enumerate(scales[::-1]))
    np.testing.assert_allclose(out[:, 6:], dd, rtol=1e-5, atol=1e-6)


def test_cmvn_stats_and_apply() -> None:
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((50, 4)) * 3 + 5).astype(np.float32)
    stats = cmvn_stats(x)
    assert stats.shape == (2, 5) and stats[0, -1] == 50
    y = apply_cmvn(x, stats, norm_vars=True)
    np.testing.assert_allclose(y.mean(0), 0, atol=1e-5)
    np.testing.assert_allclose(y.std(0), 1, atol=1e-4)
    np.testing.assert_array_equal(apply_cmvn(x, None), apply_cmvn(x, stats))  # None: the matrix's own statistics
