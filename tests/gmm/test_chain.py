"""Chain trees and alignments: subsampling a GMM alignment, converting it to a chain model's transition ids."""

from __future__ import annotations

import numpy as np
import pytest

from asrflow.gmm.chain import ChainAlignments, chain_tree_stats, phone_starts, subsample
from asrflow.gmm.model import GmmModel, topology_from_text, tree_from_bytes
from asrflow.gmm.tree import Leaf, Split, Table, context_dependency_bytes, lookup
from asrflow.kaldi import khg
from asrflow.lang.symbols import chain_topology_text, topology_text

PHONES = [1, 2, 3, 4]


def _gmm_alignment(model: GmmModel, phones: list[int], durations: list[tuple[int, ...]]) -> np.ndarray:
    """Transition ids of a 3-state GMM alignment as the decoding graph orders them: each state's first frame
    on its forward transition, the rest on its self-loop."""
    table = model.transition_states
    first = np.asarray(model.tm.state2id)
    out = []
    for phone, lengths in zip(phones, durations):
        for state, n in enumerate(lengths):
            ts = 1 + next(i for i, row in enumerate(table) if row[0] == phone and row[1] == state)
            tids = range(int(first[ts]), int(first[ts + 1]))
            forward = next(t for t in tids if not model.tm.is_self_loop(t))
            loop = next(t for t in tids if model.tm.is_self_loop(t))
            out += [forward] + [loop] * (n - 1)
    return np.asarray(out, dtype=np.int32)


def _monophone_model(topo_text: str) -> GmmModel:
    topo = topology_from_text(topo_text)
    tree = khg.monophone_context_dependency(phones=topo.phones,
                                            phone2num_pdf_classes=topo.get_phone_to_num_pdf_classes())
    return GmmModel(topo, tree, khg.TransitionModel(ctx_dep=tree, hmm_topo=topo), None)


def _chain_model() -> tuple[GmmModel, Table]:
    """A chain model whose tree asks about the left phone (is it 2?) for phone 3, and about the pdf class."""
    def classes(a: int) -> Table:
        return Table(-1, [Leaf(a), Leaf(a + 1)])

    root = Table(1, [None, classes(0), classes(2), Split(0, (2,), classes(4), classes(6)), classes(8)])
    tree = tree_from_bytes(context_dependency_bytes(root))
    topo = topology_from_text(chain_topology_text(PHONES))
    return GmmModel(topo, tree, khg.TransitionModel(ctx_dep=tree, hmm_topo=topo), None), root


def test_phone_starts_keep_two_instances_of_a_phone_apart() -> None:
    phones = np.array([5, 5, 5, 5, 5, 5, 5, 7, 7, 7])
    states = np.array([0, 0, 1, 2, 0, 1, 2, 0, 1, 2])
    assert np.flatnonzero(phone_starts(phones, states)).tolist() == [0, 4, 7]


@pytest.mark.parametrize("phase", [0, 1, 2])
def test_subsampling_keeps_every_phone_of_three_frames_or_more(phase: int) -> None:
    rng = np.random.default_rng(phase)
    lengths = rng.integers(3, 12, size=40)
    phones = np.repeat(rng.integers(1, 5, size=40), lengths)
    states = np.concatenate([np.minimum(np.arange(n) * 3 // n, 2) for n in lengths])
    sub = subsample(phones, states, 3, phase)
    assert sub is not None
    assert sub.frames.tolist() == list(range(phase, len(phones), 3))
    assert sub.segments.tolist() == sorted(sub.segments.tolist()) and len(set(sub.segments.tolist())) == 40
    first = np.r_[True, sub.segments[1:] != sub.segments[:-1]]
    assert (sub.pdf_classes == np.where(first, 0, 1)).all()
    assert (sub.phones == phones[sub.frames]).all()


def test_subsampling_reports_a_phone_that_falls_between_two_kept_frames() -> None:
    phones = np.array([1, 1, 1, 2, 2, 3, 3, 3, 3])  # phone 2 lasts two frames (a 2-state topology)
    states = np.array([0, 1, 1, 0, 1, 0, 1, 1, 1])
    assert subsample(phones, states, 3, phase=2) is None  # frames 2, 5, 8: phone 2 falls between
    assert subsample(phones, states, 3, phase=0).phones.tolist() == [1, 2, 3]  # frames 0, 3, 6
    assert chain_tree_stats(np.zeros((9, 2)), phones, states, 3).count.sum() == 3
    phones[3:5], states[3:5] = 1, [1, 1]  # phone 1 over frames 0-4, then phone 3
    assert subsample(phones, states, 3, phase=2).pdf_classes.tolist() == [0, 0, 1]


def test_conversion_gives_the_chain_tree_s_pdfs_on_the_reordered_hmm() -> None:
    source = _monophone_model(topology_text(PHONES, []))
    chain, root = _chain_model()
    phones, durations = [1, 2, 3, 3, 4], [(1, 1, 1), (2, 3, 4), (3, 3, 3), (1, 2, 1), (5, 1, 1)]
    alignment = _gmm_alignment(source, phones, durations)
    converted = ChainAlignments(source, chain, 3).convert(alignment)
    assert converted is not None and len(converted) == -(-len(alignment) // 3)
    phone_of, _ = chain.tid_tables
    # frames 0, 3, ..., 30 of phones lasting 3, 9, 9, 4 and 7 frames: 1, 3, 3, 2 and 2 output frames
    assert phone_of[converted].tolist() == [1, 2, 2, 2, 3, 3, 3, 3, 3, 4, 4]
    expected = []
    for i, (phone, kept) in enumerate(zip(phones, [1, 3, 3, 2, 2])):
        left, right = ([0] + phones)[i], (phones + [0])[i + 1]
        for k in range(kept):
            expected.append(lookup(root, {0: left, 1: phone, 2: right, -1: 0 if k == 0 else 1}))
    assert chain.tid2pdf[converted].tolist() == expected
    self_loop = [chain.tm.is_self_loop(int(t)) for t in converted]
    assert self_loop == [False, False, True, True, False, True, True, False, True, False, True]
    assert expected[4] != expected[7]  # phone 3 after phone 2 and after phone 3: the tree tells them apart
