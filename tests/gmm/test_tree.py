"""Decision trees: statistics, questions, greedy splitting, and Kaldi's binary format."""

from __future__ import annotations

import numpy as np
import pytest

from asrflow.gmm.model import tree_from_bytes
from asrflow.gmm.tree import (
    Leaf,
    Split,
    Table,
    TreeStats,
    accumulate_tree_stats,
    build_tree,
    cluster_bottom_up,
    context_dependency_bytes,
    leaves,
    lookup,
    objf,
    phone_questions,
)


def test_kaldi_binary_tree_loads_and_maps_like_python() -> None:
    root = Table(1, [None, Table(-1, [Leaf(0), Leaf(1), Leaf(2)]),
                     Split(0, (1,), Table(-1, [Leaf(3), Leaf(4), Leaf(5)]), Table(-1, [Leaf(6), Leaf(7), Leaf(8)]))])
    tree = tree_from_bytes(context_dependency_bytes(root))
    assert (tree.num_pdfs, tree.context_width, tree.central_position) == (9, 3, 1)
    for left in (0, 1, 2):
        for pdf_class in (0, 1, 2):
            ok, pdf = tree.compute([left, 2, 1], pdf_class)
            assert ok and pdf == lookup(root, {0: left, 1: 2, 2: 1, -1: pdf_class})


def test_tree_stats_use_phone_segments_for_context() -> None:
    feats = np.arange(12, dtype=np.float32).reshape(6, 2)
    phones = np.array([5, 5, 7, 7, 7, 5])
    classes = np.array([0, 1, 0, 1, 1, 0])
    stats = accumulate_tree_stats(feats, phones, classes)
    rows = {tuple(e): c for e, c in zip(stats.events.tolist(), stats.count)}
    assert rows == {(0, 5, 7, 0): 1, (0, 5, 7, 1): 1, (5, 7, 5, 0): 1, (5, 7, 5, 1): 2, (7, 5, 0, 0): 1}
    merged = TreeStats.merge([stats, stats])
    assert merged.count.sum() == 12 and np.allclose(merged.sum.sum(0), 2 * feats.sum(0))
    from dask.sizeof import sizeof

    arrays = merged.events.nbytes + merged.count.nbytes + merged.sum.nbytes + merged.sumsq.nbytes
    assert arrays < sizeof(merged) < arrays + 1000  # Dask counts the arrays a worker holds, not an empty object


def test_objf_matches_gaussian_log_likelihood() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((500, 3)) * [1.0, 2.0, 0.5] + 3
    value = objf(np.float64(len(x)), x.sum(0), (x * x).sum(0))
    mean, var = x.mean(0), x.var(0)
    ll = -0.5 * np.sum(np.log(2 * np.pi * var) + (x - mean) ** 2 / var)
    assert value == pytest.approx(ll, rel=1e-9)


def _synthetic_stats(rng: np.random.Generator) -> TreeStats:
    """Phone 2's pdf-class 0 depends on whether the left phone is 3 or 4; the rest does not."""
    events, count, total, sumsq = [], [], [], []
    for left in (1, 3, 4):
        for centre in (1, 2):
            for pdf_class in (0, 1, 2):
                shift = 4.0 if (centre == 2 and pdf_class == 0 and left in (3, 4)) else 0.0
                x = rng.standard_normal((200, 2)) + shift + centre
                events.append((left, centre, 1, pdf_class))
                count.append(200.0)
                total.append(x.sum(0))
                sumsq.append((x * x).sum(0))
    return TreeStats(np.array(events), np.array(count), np.array(total), np.array(sumsq))


def test_build_tree_finds_the_informative_question() -> None:
    stats = _synthetic_stats(np.random.default_rng(1))
    questions = [(1,), (3,), (4,), (3, 4), (1, 3, 4)]
    result = build_tree(stats, [[1], [2]], 5, questions, max_pdf_classes=3, max_leaves=3, thresh=10.0,
                        cluster_thresh=0.0, min_leaf_count=10)
    assert result.num_pdfs == 3 and result.splits == 1
    pdf = lambda left, centre, c: lookup(result.root, {0: left, 1: centre, 2: 1, -1: c})  # noqa: E731
    assert pdf(3, 2, 0) == pdf(4, 2, 0) != pdf(1, 2, 1)
    assert pdf(1, 1, 0) != pdf(1, 2, 0)
    tree = tree_from_bytes(context_dependency_bytes(result.root))
    assert tree.num_pdfs == 3
    assert sorted(leaf.answer for leaf in leaves(result.root)) == [0, 1, 2]
    assert result.pdf_count.sum() == stats.count.sum()


def test_merged_tree_stats_are_the_same_bytes_as_a_sum_over_the_concatenated_parts() -> None:
    """The reference: ``np.add.at`` over every part's rows, in part order (what a merge must equal bit for bit,
    so that sums over shards stay the same whatever the merge's internals)."""
    rng = np.random.default_rng(7)
    parts = []
    for _ in range(6):
        feats = rng.normal(size=(rng.integers(20, 200), 5)).astype(np.float32)
        phones = np.repeat(rng.integers(1, 6, size=40), 5)[:len(feats)]
        parts.append(accumulate_tree_stats(feats, phones, rng.integers(0, 3, size=len(feats))))
    merged = TreeStats.merge(parts)
    keys, inverse = np.unique(np.concatenate([p.events for p in parts]), axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    expected = [np.zeros(len(keys)), np.zeros((len(keys), 5)), np.zeros((len(keys), 5))]
    for array, name in zip(expected, ("count", "sum", "sumsq")):
        np.add.at(array, inverse, np.concatenate([getattr(p, name) for p in parts]))
    assert np.array_equal(merged.events, keys)
    for array, name in zip(expected, ("count", "sum", "sumsq")):
        assert getattr(merged, name).tobytes() == array.tobytes()
    assert len(np.unique(merged.events, axis=0)) == len(merged.events)  # each event once, as merge needs


def test_clustering_merges_leaves_that_should_not_be_split() -> None:
    stats = _synthetic_stats(np.random.default_rng(2))
    questions = [(1,), (3,), (4,), (3, 4), (1, 3, 4)]
    grown = build_tree(stats, [[1], [2]], 5, questions, 3, max_leaves=12, thresh=0.0, cluster_thresh=0.0,
                       min_leaf_count=10)
    clustered = build_tree(stats, [[1], [2]], 5, questions, 3, max_leaves=12, thresh=0.0, cluster_thresh=500.0,
                           min_leaf_count=10)
    assert grown.num_pdfs > clustered.num_pdfs >= 3


def test_phone_questions_separate_dissimilar_phones() -> None:
    stats = _synthetic_stats(np.random.default_rng(3))
    qs = phone_questions(stats, [1, 2, 7], extra=[[7]])
    assert (1, 2) in qs and (1,) in qs and (2,) in qs and (7,) in qs


def _brute_force_clusters(members, stats_of, thresh):
    """The O(m³) reference: recompute every pair's merge loss before each merge."""
    members = [list(g) for g in members]
    while len(members) > 1:
        pooled = [tuple(sum(x) for x in zip(*(stats_of[i] for i in g))) for g in members]
        own = [float(objf(*p)) for p in pooled]
        best, pair = np.inf, None
        for a in range(len(members)):
            for b in range(a + 1, len(members)):
                merged = tuple(x + y for x, y in zip(pooled[a], pooled[b]))
                cost = own[a] + own[b] - float(objf(*merged))
                if cost < best:
                    best, pair = cost, (a, b)
        if pair is None or best >= thresh:
            break
        a, b = pair
        members[a] = members[a] + members[b]
        del members[b]
    return members


def test_bottom_up_clustering_matches_the_brute_force_reference() -> None:
    rng = np.random.default_rng(4)
    for trial in range(5):
        m = 12
        stats_of = {}
        for i in range(m):
            centre = rng.normal(0, 1 + trial, 3) if i % 3 else np.zeros(3)
            x = centre + rng.normal(0, 1, (int(rng.integers(20, 80)), 3))
            stats_of[i] = (float(len(x)), x.sum(0), (x * x).sum(0))
        members = [[i] for i in range(m)]
        for thresh in (5.0, 50.0, 1e9):
            assert cluster_bottom_up(members, stats_of, thresh) == _brute_force_clusters(members, stats_of, thresh)
