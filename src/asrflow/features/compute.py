"""Kaldi-compatible MFCC and log-mel filterbank features, vectorised over many frames.

Follows Kaldi's ``compute-mfcc-feats`` / ``compute-fbank-feats`` step by step, so the
output matches kaldi-native-fbank (see docs/benchmarks.md for the measured agreement):

framing (``snip_edges``) → dither → DC removal → raw log energy → pre-emphasis → window
(povey, hamming, hanning, rectangular) → zero-pad to a power of two → power spectrum →
triangular mel bank built on Kaldi's mel scale (1127 ln(1 + f/700)) → log (floored at
float32 epsilon) → [MFCC: orthonormal DCT-II, cepstral liftering, C0 replaced by log energy].

Samples are on the int16 scale, as in Kaldi. Frames of many utterances are processed in one
block, and pre-emphasis, window and DFT are one matrix product (:func:`spectral_matrix`),
which is what makes short utterances fast. The block is processed in float64 and the
features rounded to float32 at the end: BLAS kernels sum a float32 row in an order that
depends on where it falls in the matrix, so in float32 an utterance's features depended on
the other utterances of its block (up to 6.8·10⁻⁵ apart, alone against in a block of 60);
in float64 those differences are far below float32's resolution.
"""

from __future__ import annotations

import functools
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

EPS = float(np.finfo(np.float32).eps)
BLOCK_FRAMES = 8192


@dataclass(frozen=True)
class FeatureOptions:
    """Options of one feature kind at one sample rate (hashable: caches mel banks)."""

    kind: str
    sample_rate: int
    frame_length_ms: float = 25.0
    frame_shift_ms: float = 10.0
    dither: float = 1.0
    preemphasis: float = 0.97
    remove_dc_offset: bool = True
    window: str = "povey"
    low_freq: float = 20.0
    high_freq: float = 0.0
    snip_edges: bool = True
    num_mel_bins: int = 23
    num_ceps: int = 13
    cepstral_lifter: float = 22.0
    use_energy: bool = True

    @classmethod
    def from_config(cls, features: dict[str, Any], kind: str, sample_rate: int) -> FeatureOptions:
        common = {k: features[k] for k in ("frame_length_ms", "frame_shift_ms", "dither", "preemphasis",
                                           "remove_dc_offset", "window", "low_freq", "high_freq", "snip_edges")}
        return cls(kind=kind, sample_rate=sample_rate, **common, **features[kind])

    @property
    def frame_length(self) -> int:
        return int(self.sample_rate * 0.001 * self.frame_length_ms + 1e-6)

    @property
    def frame_shift(self) -> int:
        return int(self.sample_rate * 0.001 * self.frame_shift_ms + 1e-6)

    @property
    def fft_size(self) -> int:
        return 1 << max(0, (self.frame_length - 1).bit_length())

    @property
    def dim(self) -> int:
        if self.kind == "mfcc":
            return self.num_ceps
        return self.num_mel_bins + (1 if self.use_energy else 0)


def mel_scale(freq: np.ndarray | float) -> np.ndarray:
    """Kaldi's mel scale."""
    return 1127.0 * np.log(1.0 + np.asarray(freq, dtype=np.float64) / 700.0)


@functools.lru_cache(maxsize=32)
def mel_banks(opts: FeatureOptions) -> np.ndarray:
    """Triangular filters, shape (num_mel_bins, fft_size // 2 + 1); the Nyquist bin stays zero."""
    nyquist = 0.5 * opts.sample_rate
    high = opts.high_freq if opts.high_freq > 0 else nyquist + opts.high_freq
    if not 0 <= opts.low_freq < high <= nyquist:
        raise ValueError(f"mel bank edges low_freq={opts.low_freq} high_freq={high} do not fit "
                         f"the Nyquist frequency {nyquist} Hz")
    n_fft_bins = opts.fft_size // 2
    mel_low, mel_high = mel_scale(opts.low_freq), mel_scale(high)
    delta = (mel_high - mel_low) / (opts.num_mel_bins + 1)
    mel = mel_scale(np.arange(n_fft_bins) * opts.sample_rate / opts.fft_size)
    left = mel_low + delta * np.arange(opts.num_mel_bins)[:, None]
    center, right = left + delta, left + 2 * delta
    up = (mel - left) / (center - left)
    down = (right - mel) / (right - center)
    weights = np.where(mel <= center, up, down)
    weights = np.where((mel > left) & (mel < right), weights, 0.0)
    banks = np.zeros((opts.num_mel_bins, n_fft_bins + 1), dtype=np.float32)
    banks[:, :n_fft_bins] = weights
    return banks


@functools.lru_cache(maxsize=32)
def window_function(name: str, length: int) -> np.ndarray:
    """Kaldi's analysis windows (``povey`` is a Hann window raised to 0.85)."""
    n = np.arange(length, dtype=np.float64)
    a = 2 * np.pi / (length - 1) if length > 1 else 0.0
    if name == "povey":
        w = (0.5 - 0.5 * np.cos(a * n)) ** 0.85
    elif name == "hamming":
        w = 0.54 - 0.46 * np.cos(a * n)
    elif name == "hanning":
        w = 0.5 - 0.5 * np.cos(a * n)
    elif name == "rectangular":
        w = np.ones(length)
    else:
        raise ValueError(f"unknown window {name!r}")
    return w.astype(np.float32)


@functools.lru_cache(maxsize=32)
def dct_lifter(num_mel_bins: int, num_ceps: int, lifter: float) -> np.ndarray:
    """Orthonormal DCT-II rows 0..num_ceps-1 with liftering folded in: shape (num_mel_bins, num_ceps)."""
    k = np.arange(num_ceps)[:, None]
    n = np.arange(num_mel_bins)[None, :]
    dct = np.sqrt(2.0 / num_mel_bins) * np.cos(np.pi / num_mel_bins * (n + 0.5) * k)
    dct[0] *= np.sqrt(0.5)
    if lifter:
        dct *= (1.0 + 0.5 * lifter * np.sin(np.pi * np.arange(num_ceps) / lifter))[:, None]
    return np.ascontiguousarray(dct.T)


def num_frames(num_samples: int, opts: FeatureOptions) -> int:
    """Number of frames Kaldi extracts from ``num_samples`` samples."""
    length, shift = opts.frame_length, opts.frame_shift
    if opts.snip_edges:
        return 0 if num_samples < length else 1 + (num_samples - length) // shift
    return (num_samples + shift // 2) // shift


def frame_signal(samples: np.ndarray, opts: FeatureOptions) -> np.ndarray:
    """Cut a signal into frames (num_frames, frame_length), Kaldi's edge handling."""
    count, length, shift = num_frames(samples.size, opts), opts.frame_length, opts.frame_shift
    if count == 0:
        return np.zeros((0, length), dtype=np.float32)
    if opts.snip_edges:
        return np.lib.stride_tricks.as_strided(
            samples, (count, length), (samples.strides[0] * shift, samples.strides[0]), writeable=False
        )
    starts = np.arange(count) * shift + shift // 2 - length // 2
    index = starts[:, None] + np.arange(length)[None, :]
    n = samples.size
    index = np.where(index < 0, -index - 1, index)
    index = np.where(index >= n, 2 * n - 1 - index, index)
    return samples[np.clip(index, 0, n - 1)].astype(np.float32)


NOISE_TABLE = 1 << 20


@functools.lru_cache(maxsize=4)
def noise_table(seed: int) -> np.ndarray:
    """A fixed table of N(0, 1) samples (float32) from ``seed``; dither reads slices of it."""
    return np.random.default_rng(seed).standard_normal(NOISE_TABLE, dtype=np.float32)


def dither_noise(key: str, size: int, seed: int) -> np.ndarray:
    """N(0, 1) dither for one utterance: a slice of :func:`noise_table` at an offset hashed
    from the utterance id, so it depends only on (seed, utterance) — never on sharding — and
    costs a copy instead of drawing fresh Gaussians (a quarter of compute time otherwise)."""
    table = noise_table(seed)
    start = zlib.crc32(key.encode()) % NOISE_TABLE
    if start + size <= NOISE_TABLE:
        return table[start : start + size]
    return np.take(table, np.arange(start, start + size) % NOISE_TABLE)


@functools.lru_cache(maxsize=32)
def spectral_matrix(opts: FeatureOptions) -> np.ndarray:
    """Pre-emphasis, window and zero-padded real DFT folded into one matrix.

    All three are linear, so for DC-free frames ``F`` (rows) the real and imaginary parts of
    the spectrum are ``F @ A`` with ``A`` = Pᵀ · diag(window) · [cos; sin]ᵀ, shape
    (frame_length, 2 · (fft_size // 2 + 1)). One BLAS call replaces three passes and an FFT:
    about twice as fast as numpy/scipy FFT for Kaldi's short frames.
    """
    length, bins = opts.frame_length, opts.fft_size // 2 + 1
    preemph = np.eye(length)
    if opts.preemphasis:
        preemph[np.arange(1, length), np.arange(length - 1)] = -opts.preemphasis
        preemph[0, 0] -= opts.preemphasis
    angles = 2 * np.pi * np.outer(np.arange(bins), np.arange(length)) / opts.fft_size
    dft = np.concatenate([np.cos(angles), np.sin(angles)])
    weights = window_function(opts.window, length).astype(np.float64)
    return np.ascontiguousarray((preemph.T * weights) @ dft.T)


@functools.lru_cache(maxsize=32)
def power_mel_matrix(opts: FeatureOptions) -> np.ndarray:
    """Mel bank applied to squared real and imaginary parts: shape (2 · bins, num_mel_bins)."""
    banks = mel_banks(opts).T
    return np.ascontiguousarray(np.concatenate([banks, banks]), dtype=np.float64)


def _process_frames(frames: np.ndarray, opts: FeatureOptions) -> np.ndarray:
    """Frames (float64, already dithered; modified in place) → float32 features, all rows in one pass."""
    if opts.remove_dc_offset:
        frames -= frames.mean(axis=1, keepdims=True)
    energy = np.log(np.maximum(np.einsum("ij,ij->i", frames, frames), EPS)) if opts.use_energy else None
    spectrum = frames @ spectral_matrix(opts)
    np.square(spectrum, out=spectrum)
    mel = spectrum @ power_mel_matrix(opts)
    np.maximum(mel, EPS, out=mel)
    np.log(mel, out=mel)
    if opts.kind == "mfcc":
        feats = mel @ dct_lifter(opts.num_mel_bins, opts.num_ceps, opts.cepstral_lifter)
        if energy is not None:
            feats[:, 0] = energy
        return feats.astype(np.float32, copy=False)
    if energy is not None:
        mel = np.concatenate([energy[:, None], mel], axis=1)
    return mel.astype(np.float32, copy=False)


def compute_batch(
    signals: list[np.ndarray], opts: FeatureOptions, keys: list[str] | None = None, seed: int = 0
) -> list[np.ndarray]:
    """Features for many signals (int16 scale, at ``opts.sample_rate``), one matrix each.

    ``keys`` (utterance ids) and ``seed`` choose each signal's dither, required when
    ``opts.dither`` > 0. Dither is added to the signal once, before framing (Kaldi draws it
    per frame; both are N(0, dither²) per sample).
    """
    if opts.dither and keys is None:
        raise ValueError("dither needs one key (utterance id) per signal")
    # One BLAS thread: a multi-threaded GEMM splits the frames differently and rounds silence
    # frames' power spectra differently (log-mel up to 1e-3 apart with 2 threads), so features
    # would depend on the job's thread count (Snakemake sets OPENBLAS_NUM_THREADS = threads).
    # Parallelism comes from the Dask workers, one thread each.
    with threadpool_limits(limits=1, user_api="blas"):
        return _compute_blocks(signals, opts, keys, seed)


def _compute_blocks(signals: list[np.ndarray], opts: FeatureOptions, keys: list[str] | None,
                    seed: int) -> list[np.ndarray]:
    """:func:`compute_batch` in blocks of about ``BLOCK_FRAMES`` frames, one GEMM pass each."""
    counts = [num_frames(s.size, opts) for s in signals]
    out: list[np.ndarray] = []
    start = 0
    while start < len(signals):
        stop, total = start, 0
        while stop < len(signals) and (total < BLOCK_FRAMES or stop == start):
            total += counts[stop]
            stop += 1
        block = np.empty((total, opts.frame_length), dtype=np.float64)
        row = 0
        for i in range(start, stop):
            signal = signals[i]
            if opts.dither and counts[i]:
                signal = signal + opts.dither * dither_noise(keys[i], signal.size, seed)
            block[row : row + counts[i]] = frame_signal(signal, opts)
            row += counts[i]
        feats = _process_frames(block, opts) if total else np.zeros((0, opts.dim), np.float32)
        offsets = np.cumsum([0, *counts[start:stop]])
        out.extend(feats[a:b] for a, b in zip(offsets[:-1], offsets[1:]))
        start = stop
    return out


def compute(samples: np.ndarray, opts: FeatureOptions, key: str | None = None, seed: int = 0) -> np.ndarray:
    """Features of one signal (int16 scale); ``key`` (utterance id) and ``seed`` choose the dither."""
    return compute_batch([samples], opts, [key] if key is not None else None, seed)[0]
