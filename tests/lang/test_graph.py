"""Grammar FST edits for the decoding graph: the edge filler."""

from __future__ import annotations

from asrflow.kaldi import fst_arcs, kfst
from asrflow.lang.graph import add_edge_filler

YES, NO, UNK = 1, 2, 3


def cost(fst, labels: list[int]) -> float | None:
    """The cost of reading ``labels`` from the start to a final state (the test grammars are deterministic)."""
    arcs = fst_arcs(fst)
    state, total = fst.start, 0.0
    for label in labels:
        nxt = [(w, d) for s, i, _, w, d in arcs if s == state and i == label]
        if not nxt:
            return None
        total, state = total + nxt[0][0], nxt[0][1]
    final = fst.final(state)
    return None if final == kfst.TropicalWeight.zero else total + float(final.value)


def test_the_filler_may_come_once_before_and_once_after_the_sentence_and_writes_nothing() -> None:
    grammar = kfst.compile(f"0 1 {YES} {YES} 0.1\n1 2 {NO} {NO} 0.3\n1 0.5\n2 0.2\n")
    filled = add_edge_filler(grammar, UNK, 2.0)
    assert cost(filled, [YES]) == cost(grammar, [YES]) and abs(cost(filled, [YES, NO]) - 0.6) < 1e-6
    assert abs(cost(filled, [UNK, YES]) - 2.6) < 1e-6  # the filler's cost on top of the sentence's
    assert abs(cost(filled, [YES, UNK]) - 2.6) < 1e-6  # the end's final weight is paid on the filler arc
    assert abs(cost(filled, [UNK, YES, NO, UNK]) - 4.6) < 1e-6
    for inside in ([UNK, UNK, YES], [YES, UNK, NO], [YES, UNK, UNK], [UNK]):
        assert cost(filled, inside) is None, inside
    assert {o for _, i, o, _, _ in fst_arcs(filled) if i == UNK} == {0}
    assert cost(grammar, [UNK, YES]) is None  # the grammar itself is left as it was
