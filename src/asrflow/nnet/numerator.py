"""The numerator of chain training with slack: every timing of the aligned phones near the alignment's.

A GMM alignment fixes each phone's first and last frame, but only to within a frame or two: its
boundaries are one Viterbi path of a weaker model. Kaldi's chain supervision therefore lets each
phone instance begin and end up to a few frames from where the alignment puts it (``--left-tolerance``
and ``--right-tolerance``, 5 input frames; ``chain-supervision.cc``'s time enforcer), and the
numerator sums over all those timings instead of scoring one path. The network then learns where
a boundary is from the data rather than from the GMM.

Here the numerator of an utterance is the chain topology run over its phone sequence as aligned:
phone instance ``k`` is a state that emits its forward pdf on its first frame and its self-loop pdf
on the others, the instances follow in order, each lasts at least one frame, and instance ``k`` may
only occupy the frames ``[start_k − tolerance, end_k + tolerance)`` (output frames). With tolerance 0
the only path is the alignment itself. :func:`numerator_log_prob` is that forward algorithm in log
space over a batch, vectorised over the phones (``2 K`` states per utterance, one step per frame);
its gradient, the numerator's pdf posteriors per frame (:func:`numerator_posteriors`), is what the
MMI term subtracts from the denominator's and what the cross-entropy term learns from, as Kaldi's
chain models train their ``output-xent`` on the numerator posteriors.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

NEG = -1e30  # log of "no path": finite, so log-add-exp of two impossible states has a gradient of 0, not NaN


@dataclass(frozen=True)
class Segments:
    """One utterance's phone instances as aligned: their first output frame, the frame after their last, and
    the forward and self-loop pdfs of each (all ``(K,)``)."""

    starts: np.ndarray
    ends: np.ndarray
    forward: np.ndarray
    loop: np.ndarray

    @property
    def frames(self) -> int:
        return int(self.ends[-1]) if len(self.ends) else 0


def segments_from_transitions(tids: np.ndarray, self_loop: np.ndarray, forward_pdf: np.ndarray,
                              loop_pdf: np.ndarray) -> Segments:
    """The phone instances of a chain alignment (transition ids, one per output frame): a phone starts at every
    frame whose transition is not a self-loop (the chain HMM's first frame takes the forward transition); its
    pdfs come from that transition's state. ``self_loop``, ``forward_pdf`` and ``loop_pdf`` are tables indexed
    by transition id."""
    tids = np.asarray(tids, dtype=np.int64)
    if len(tids) and self_loop[tids[0]]:
        raise ValueError("a chain alignment must start with a phone's forward transition, not a self-loop")
    starts = np.flatnonzero(~self_loop[tids])
    ends = np.append(starts[1:], len(tids))
    return Segments(starts, ends, forward_pdf[tids[starts]], loop_pdf[tids[starts]])


def numerator_log_prob(loglikes: torch.Tensor, lengths: torch.Tensor, batch: Sequence[Segments],
                       tolerance: int) -> torch.Tensor:
    """``log Σ exp(Σ_t loglikes[b, t, pdf_t])`` over every timing of utterance ``b``'s phone instances within
    ``tolerance`` frames of the aligned one (module docstring), for each ``b``; differentiable (autograd).

    ``loglikes`` is ``(B, T, pdfs)``; frames at and after ``lengths[b]`` are ignored, and each utterance's
    segments must cover exactly its ``lengths[b]`` frames."""
    size, frames, _ = loglikes.shape
    device, dtype = loglikes.device, loglikes.dtype
    longest = max(len(s.starts) for s in batch)

    def padded(name: str, fill: int) -> torch.Tensor:
        table = np.full((size, longest), fill, dtype=np.int64)
        for b, s in enumerate(batch):
            table[b, :len(s.starts)] = getattr(s, name)
        return torch.from_numpy(table).to(device)

    for b, s in enumerate(batch):
        if s.frames != int(lengths[b]):
            raise ValueError(f"utterance {b} of the batch: its alignment has {s.frames} output frames, "
                             f"the network gave {int(lengths[b])}")
    counts = torch.tensor([len(s.starts) for s in batch], device=device)
    lowest = (padded("starts", frames) - tolerance).clamp_min(0)  # padding phones: never allowed
    highest = padded("ends", 0) + tolerance
    index = torch.arange(frames, device=device)[None, :, None]
    allowed = (index >= lowest[:, None, :]) & (index < highest[:, None, :])  # (B, T, K)
    first = loglikes.gather(2, padded("forward", 0)[:, None, :].expand(size, frames, longest))
    later = loglikes.gather(2, padded("loop", 0)[:, None, :].expand(size, frames, longest))
    impossible = torch.full((size, 1), NEG, dtype=dtype, device=device)
    alpha_first = torch.cat([first[:, 0, :1], impossible.expand(size, longest - 1)], dim=1)
    alpha_later = impossible.expand(size, longest)
    for t in range(1, frames):
        before = torch.logaddexp(alpha_first, alpha_later)  # in phone k after frame t − 1
        new_first = torch.cat([impossible, before[:, :-1]], dim=1) + first[:, t]  # phone k starts at frame t
        new_later = before + later[:, t]  # phone k goes on
        keep = allowed[:, t]
        active = (t < lengths.to(device))[:, None]
        alpha_first = torch.where(active, torch.where(keep, new_first, NEG), alpha_first)
        alpha_later = torch.where(active, torch.where(keep, new_later, NEG), alpha_later)
    last = (counts - 1)[:, None]
    return torch.logaddexp(alpha_first.gather(1, last), alpha_later.gather(1, last))[:, 0]


def numerator_posteriors(loglikes: torch.Tensor, lengths: torch.Tensor, batch: Sequence[Segments],
                         tolerance: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The numerator's log-probability per utterance ``(B,)`` and its pdf posteriors per frame ``(B, T, pdfs)``
    (summing to 1 on each of an utterance's frames, 0 on padding), both without a gradient."""
    x = loglikes.detach().requires_grad_()
    with torch.enable_grad():
        value = numerator_log_prob(x, lengths, batch, tolerance)
        (posteriors,) = torch.autograd.grad(value.sum(), x)
    return value.detach(), posteriors


class ChainNumerator:
    """Each training utterance's phone instances, read from its chain alignment when first asked for, and the
    tolerance they may move by: what :class:`~asrflow.nnet.mmi.MmiObjective` needs for a numerator with slack."""

    def __init__(self, alignments: Mapping[str, np.ndarray], model, tolerance: int) -> None:
        if tolerance < 0:
            raise ValueError(f"numerator tolerance must be ≥ 0 output frames, not {tolerance}")
        self.alignments, self.tolerance = alignments, tolerance
        self.self_loop = model.self_loops
        table = model.transition_states  # (phone, hmm state, forward pdf, self-loop pdf) per transition state
        states = np.asarray(model.tm.id2state, dtype=np.int64)
        self.forward_pdf = np.concatenate([[0], table[states[1:] - 1, 2]])
        self.loop_pdf = np.concatenate([[0], table[states[1:] - 1, 3]])
        self._segments: dict[str, Segments] = {}

    def segments(self, utt: str) -> Segments:
        """Utterance ``utt``'s phone instances (cached)."""
        if utt not in self._segments:
            if utt not in self.alignments:
                raise KeyError(f"no chain alignment for utterance {utt!r}: the numerator needs one per utterance")
            self._segments[utt] = segments_from_transitions(self.alignments[utt], self.self_loop,
                                                            self.forward_pdf, self.loop_pdf)
        return self._segments[utt]

    def __call__(self, loglikes: torch.Tensor, lengths: torch.Tensor,
                 utts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """:func:`numerator_posteriors` of a batch of these utterances."""
        return numerator_posteriors(loglikes, lengths, [self.segments(u) for u in utts], self.tolerance)


def numerator_speed(num_pdfs: int, batch: int, frames: int, tolerance: int, repeats: int = 3,
                    phone_frames: int = 3) -> float:
    """Milliseconds per frame of the batch of :func:`numerator_posteriors` (both passes, the best of ``repeats``)
    over ``batch`` utterances of ``frames`` random log-likelihoods, each with a phone every ``phone_frames``
    frames (random pdfs): what the slack adds to a training step, beside :func:`~asrflow.nnet.mmi.denominator_speed`."""
    import time

    generator = np.random.default_rng(0)
    starts = np.arange(0, frames, phone_frames)
    ends = np.append(starts[1:], frames)
    segments = [Segments(starts, ends, generator.integers(0, num_pdfs, len(starts)),
                         generator.integers(0, num_pdfs, len(starts))) for _ in range(batch)]
    loglikes = torch.randn(batch, frames, num_pdfs, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    lengths = torch.full((batch,), frames)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        numerator_posteriors(loglikes, lengths, segments, tolerance)
        best = min(best, time.perf_counter() - start)
    return round(1000 * best / frames, 3)
