"""The chain numerator with slack: its forward algorithm against enumerating the timings, its posteriors, the
phone instances of a chain alignment, and the MMI objective with it."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from asrflow.nnet.mmi import MmiObjective, denominator_log_prob, graph_from_arcs, mmi
from asrflow.nnet.numerator import (
    ChainNumerator,
    Segments,
    numerator_log_prob,
    numerator_posteriors,
    segments_from_transitions,
)

# two utterances: three phones over 7 frames, two over 5 (padded to 7)
FIRST = Segments(np.array([0, 2, 5]), np.array([2, 5, 7]), np.array([0, 2, 4]), np.array([1, 3, 5]))
SECOND = Segments(np.array([0, 3]), np.array([3, 5]), np.array([1, 3]), np.array([0, 2]))
LENGTHS = torch.tensor([7, 5])


def timings(s: Segments, tolerance: int):
    """Every (starts, ends) of ``s``'s phones, each at least a frame long, within ``tolerance`` of its own."""
    frames, count = s.frames, len(s.starts)
    for cuts in itertools.combinations(range(1, frames), count - 1):
        starts, ends = [0, *cuts], [*cuts, frames]
        if all(s.starts[k] - tolerance <= starts[k] and ends[k] <= s.ends[k] + tolerance for k in range(count)):
            yield starts, ends


def pdf_path(s: Segments, starts: list[int], ends: list[int]) -> list[int]:
    return [s.forward[k] if t == starts[k] else s.loop[k]
            for k in range(len(starts)) for t in range(starts[k], ends[k])]


def brute_force(x: torch.Tensor, s: Segments, tolerance: int) -> tuple[float, np.ndarray]:
    """log Σ over the timings, and the pdf posteriors per frame."""
    scores, paths = [], []
    for starts, ends in timings(s, tolerance):
        path = pdf_path(s, starts, ends)
        scores.append(sum(float(x[t, p]) for t, p in enumerate(path)))
        paths.append(path)
    total = float(np.logaddexp.reduce(scores))
    posteriors = np.zeros((s.frames, x.shape[1]))
    for score, path in zip(scores, paths):
        posteriors[np.arange(s.frames), path] += np.exp(score - total)
    return total, posteriors


@pytest.mark.parametrize("tolerance", [0, 1, 2, 6])
def test_numerator_sums_every_timing_within_the_tolerance(tolerance: int) -> None:
    x = torch.randn(2, 7, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(tolerance))
    value, posteriors = numerator_posteriors(x, LENGTHS, [FIRST, SECOND], tolerance)
    for b, s in enumerate([FIRST, SECOND]):
        expected, expected_posteriors = brute_force(x[b], s, tolerance)
        assert value[b].item() == pytest.approx(expected, abs=1e-9)
        assert np.allclose(posteriors[b, :s.frames].numpy(), expected_posteriors, atol=1e-9)
        assert not posteriors[b, s.frames:].any()  # padding
    assert len(list(timings(FIRST, 1))) > 1  # the slack lets the boundaries move


def test_without_tolerance_the_numerator_is_the_aligned_path() -> None:
    x = torch.randn(2, 7, 6, dtype=torch.float64)
    value, posteriors = numerator_posteriors(x, LENGTHS, [FIRST, SECOND], 0)
    for b, s in enumerate([FIRST, SECOND]):
        path = pdf_path(s, list(s.starts), list(s.ends))
        assert value[b].item() == pytest.approx(sum(float(x[b, t, p]) for t, p in enumerate(path)))
        assert posteriors[b, :s.frames].argmax(-1).tolist() == path and posteriors[b].sum() == s.frames


def test_numerator_survives_long_utterances_and_rejects_a_wrong_length() -> None:
    phones = 40
    s = Segments(np.arange(phones) * 10, np.arange(1, phones + 1) * 10, np.arange(phones) % 7, np.arange(phones) % 5)
    x = 30 * torch.randn(1, 400, 8, dtype=torch.float64)
    value, posteriors = numerator_posteriors(x, torch.tensor([400]), [s], 3)
    assert torch.isfinite(value).all() and torch.allclose(posteriors.sum(-1), torch.ones(1, 400, dtype=torch.float64))
    with pytest.raises(ValueError, match="399"):
        numerator_log_prob(x, torch.tensor([399]), [s], 3)


def test_phone_instances_start_on_each_forward_transition() -> None:
    # transition ids 1..6: 1, 3, 5 forward, 2, 4, 6 their self-loops; pdfs (forward, loop) per transition id
    self_loop = np.array([False, False, True, False, True, False, True])
    forward, loop = np.array([0, 10, 10, 20, 20, 30, 30]), np.array([0, 11, 11, 21, 21, 31, 31])
    s = segments_from_transitions(np.array([1, 2, 2, 5, 3, 4]), self_loop, forward, loop)
    assert s.starts.tolist() == [0, 3, 4] and s.ends.tolist() == [3, 4, 6] and s.frames == 6
    assert s.forward.tolist() == [10, 30, 20] and s.loop.tolist() == [11, 31, 21]  # a one-frame phone's loop pdf too
    with pytest.raises(ValueError, match="self-loop"):
        segments_from_transitions(np.array([2, 2]), self_loop, forward, loop)


def test_chain_numerator_reads_the_pdfs_from_the_chain_model() -> None:
    from tests.gmm.test_chain import _chain_model

    chain, _ = _chain_model()
    tids = range(1, chain.tm.num_transition_ids + 1)
    forward_tid = next(t for t in tids if not chain.tm.is_self_loop(t))
    state = chain.tm.id2state[forward_tid]
    loop_tid = next(t for t in tids if chain.tm.is_self_loop(t) and chain.tm.id2state[t] == state)
    numerator = ChainNumerator({"u": np.array([forward_tid, loop_tid, loop_tid, forward_tid])}, chain, 1)
    s = numerator.segments("u")
    assert s.starts.tolist() == [0, 3] and s.forward.tolist() == [chain.tid2pdf[forward_tid]] * 2
    assert s.loop.tolist() == [chain.tid2pdf[loop_tid]] * 2
    with pytest.raises(KeyError, match="no chain alignment for utterance 'v'"):
        numerator.segments("v")


ARCS = [(0, c + 1, c, 1.0) for c in range(6)] + [(a + 1, b + 1, b, 0.5) for a in range(6) for b in range(6)]


def _objective_batch(logits: torch.Tensor) -> dict:
    targets = torch.tensor([pdf_path(FIRST, list(FIRST.starts), list(FIRST.ends)),
                            pdf_path(SECOND, list(SECOND.starts), list(SECOND.ends)) + [-100, -100]])
    return {"utts": ["a", "b"], "targets": targets, "target_lengths": LENGTHS}


class _Fixed(ChainNumerator):
    def __init__(self, tolerance: int) -> None:
        self.tolerance, self._segments = tolerance, {"a": FIRST, "b": SECOND}


def test_objective_with_an_exact_numerator_is_the_objective_without_one() -> None:
    graph = graph_from_arcs(ARCS, {c + 1: 0.0 for c in range(6)}, 0, 7)
    logits = torch.randn(2, 7, 6, requires_grad=True)
    batch = _objective_batch(logits)
    plain, plain_stats = MmiObjective(graph, torch.zeros(6), 2.0, 1.0)(logits, LENGTHS, batch)
    (plain_grad,) = torch.autograd.grad(plain, logits)
    exact, exact_stats = MmiObjective(graph, torch.zeros(6), 2.0, 1.0, numerator=_Fixed(0))(logits, LENGTHS, batch)
    (exact_grad,) = torch.autograd.grad(exact, logits)
    assert exact.item() == pytest.approx(plain.item(), rel=1e-6) and torch.allclose(exact_grad, plain_grad, atol=1e-6)
    assert exact_stats.parts["mmi"].item() == pytest.approx(plain_stats.parts["mmi"].item(), rel=1e-6)


def test_objective_with_slack_subtracts_the_numerator_and_learns_its_posteriors() -> None:
    graph = graph_from_arcs(ARCS, {c + 1: 0.0 for c in range(6)}, 0, 7)
    logits = torch.randn(2, 7, 6, dtype=torch.float64, requires_grad=True)
    batch = _objective_batch(logits)
    loss, stats = MmiObjective(graph, torch.zeros(6), 2.0, 1.0, numerator=_Fixed(1))(logits, LENGTHS, batch)
    loglikes = torch.log_softmax(logits.detach(), -1)
    value, posteriors = numerator_posteriors(loglikes, LENGTHS, [FIRST, SECOND], 1)
    denominator = mmi(loglikes, LENGTHS, batch["targets"], graph) + (
        loglikes.gather(2, batch["targets"].clamp_min(0)[..., None])[..., 0] * (batch["targets"] != -100)).sum(1)
    cross_entropy = -(posteriors * loglikes).sum() / 12
    assert stats.parts["mmi"].item() / 12 == pytest.approx(((denominator - value).sum() / 12).item(), rel=1e-5)
    assert loss.item() == pytest.approx((cross_entropy + 2.0 * (denominator - value).sum() / 12).item(), rel=1e-5)
    # the gradient: the cross-entropy's with the posteriors as fixed targets, the MMI term's through the numerator
    (grad,) = torch.autograd.grad(loss, logits)
    z = logits.detach().clone().requires_grad_()
    ll = torch.log_softmax(z, -1)
    expected = -(posteriors * ll).sum() / 12 + 2.0 * (
        denominator_log_prob(ll, LENGTHS, graph) - numerator_log_prob(ll, LENGTHS, [FIRST, SECOND], 1)).sum() / 12
    (expected_grad,) = torch.autograd.grad(expected, z)
    assert torch.allclose(grad, expected_grad, atol=1e-8)


def test_numerator_speed_is_milliseconds_per_frame() -> None:
    from asrflow.nnet.numerator import numerator_speed

    assert 0 < numerator_speed(20, 3, 30, 2, repeats=1) < 1000
