"""Speed perturbation (Kaldi's ``perturb_data_dir_speed_3way.sh``; Ko et al., 2015).

A copy of an utterance at speed factor ``f`` is its audio played ``f`` times as fast
(``sox speed f``): ``1/f`` as long, every frequency — pitch and formants — times ``f``.
Copies are named as in Kaldi: utterance, recording and speaker get the prefix ``sp<f>-``,
so each perturbed speaker has its own CMVN statistics. The data stage writes, next to every
training split ``<train>``, the split ``<train>_sp``: its utterances and one copy of each per
factor. The factor is kept in the data dir's ``utt2speed``; the features stage applies it
when it reads the audio (one resampling, no intermediate files).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import numpy as np

from asrflow.data.audio import resample
from asrflow.data.validate import Utterance

SUFFIX = "_sp"


def perturbed_split(train: str) -> str:
    """The split holding ``train`` and its speed-perturbed copies."""
    return train + SUFFIX


def prefix(factor: float) -> str:
    """Kaldi's id prefix of a copy at ``factor`` (``sp0.9-``)."""
    return f"sp{factor:g}-"


def copy_factors(factors: Iterable[float]) -> list[float]:
    """The factors that make copies: sorted, distinct, 1.0 (the originals, always kept) left out."""
    return sorted({float(f) for f in factors} - {1.0})


def copy_ids(utts: Iterable[str], factors: Iterable[float]) -> set[str]:
    """The ids of the copies of ``utts`` at each factor other than 1.0."""
    return {prefix(f) + u for f in copy_factors(factors) for u in utts}


def speed_copy(utt: Utterance, factor: float) -> Utterance:
    """``utt`` played ``factor`` times as fast: new ids, ``1/factor`` of the duration, same audio file."""
    tag = prefix(factor)
    return dataclasses.replace(utt, utt_id=tag + utt.utt_id, speaker=tag + utt.speaker,
                               recording=tag + utt.recording, duration=round(utt.duration / factor, 4),
                               speed=utt.speed * factor)


def with_copies(utts: Iterable[Utterance], factors: Iterable[float]) -> list[Utterance]:
    """``utts`` and one copy of each per factor (factor 1.0: the originals only)."""
    utts = list(utts)
    return utts + [speed_copy(u, f) for f in copy_factors(factors) for u in utts]


def perturb_speed(samples: np.ndarray, rate: int, factor: float, target: int) -> np.ndarray:
    """Samples at ``rate`` played ``factor`` times as fast, at ``target`` Hz (``sox speed`` then ``rate``).

    Reading ``rate`` Hz audio as if it were ``rate · factor`` Hz and resampling that to
    ``target`` shortens it by ``factor`` and raises every frequency by ``factor``.
    """
    if factor <= 0:
        raise ValueError(f"speed factor must be positive, got {factor}")
    return resample(samples, rate * factor, target)
