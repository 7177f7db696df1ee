"""The one place that imports the Kaldi Python wheels, in the order that works.

Importing kaldifst, kaldilm or kaldi_decoder before kaldi_hmm_gmm hangs (the wheels bundle
different builds of OpenFst); every asrflow module takes them from here::

    from asrflow.kaldi import khg, kfst
"""

from __future__ import annotations

from collections.abc import Callable

import _kaldi_hmm_gmm as khg_ext  # loaded by kaldi_hmm_gmm; holds mle_diag_gmm_update
import kaldi_hmm_gmm as khg  # noqa: I001  (must come first)
import kaldifst as kfst
import kaldilm

__all__ = ["add_word_penalty", "fst_arcs", "kaldilm", "kfst", "khg", "khg_ext", "map_arcs", "map_input_labels"]


def fst_arcs(fst) -> list[tuple[int, int, int, float, int]]:
    """All arcs ``(state, ilabel, olabel, weight, nextstate)`` of an FST."""
    out = []
    states = kfst.StateIterator(fst)
    while not states.done:
        s = states.value
        arcs = kfst.ArcIterator(fst, s)
        while not arcs.done:
            a = arcs.value
            out.append((s, a.ilabel, a.olabel, float(a.weight.value), a.nextstate))
            arcs.next()
        states.next()
    return out


def map_arcs(fst, arc: Callable[[object], object]):
    """A copy of ``fst`` (same states, start and finals) with every arc replaced by ``arc(a)``."""
    out = kfst.StdVectorFst()
    states = kfst.StateIterator(fst)
    while not states.done:
        out.add_state()
        states.next()
    out.start = fst.start
    states = kfst.StateIterator(fst)
    while not states.done:
        s = states.value
        out.set_final(s, fst.final(s))
        arcs = kfst.ArcIterator(fst, s)
        while not arcs.done:
            out.add_arc(s, arc(arcs.value))
            arcs.next()
        states.next()
    return out


def map_input_labels(fst, labels: set[int]):
    """A copy of ``fst`` whose input labels in ``labels`` become epsilon (``fstrmsymbols``)."""
    return map_arcs(fst, lambda a: kfst.StdArc(0 if a.ilabel in labels else a.ilabel, a.olabel, a.weight,
                                               a.nextstate))


def add_word_penalty(fst, penalty: float, words: int | None = None):
    """A copy of ``fst`` with ``penalty`` added to the cost of every arc that outputs a word.

    Kaldi's ``lattice-add-penalty --word-ins-penalty``, applied to the graph: a decoder then
    pays ``penalty`` per output word on top of the LM cost, which trades insertions for deletions.
    ``words``: the highest word id (read from the arcs when None). Done in OpenFst as a
    composition with a one-state transducer that copies every word at cost ``penalty``: the
    same states and arcs (perhaps numbered otherwise), without a Python loop over the arcs of
    a large HCLG (:func:`map_arcs`).
    """
    if words is None:
        words = max((olabel for _, _, olabel, _, _ in fst_arcs(fst)), default=0)
    copy = kfst.StdVectorFst()
    copy.add_state()
    copy.start = 0
    copy.set_final(0, kfst.TropicalWeight(0.0))
    for word in range(1, words + 1):
        copy.add_arc(0, kfst.StdArc(word, word, kfst.TropicalWeight(penalty), 0))
    kfst.arcsort(copy, sort_type="ilabel")
    return kfst.compose(fst, copy, match_side="right", connect=False)
