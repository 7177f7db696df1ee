"""The one place that imports the Kaldi Python wheels, in the order that works.

Importing kaldifst, kaldilm or kaldi_decoder before kaldi_hmm_gmm hangs (see
``shared/notes/kaldi-wheels.md``); every asrflow module takes them from here::

    from asrflow.kaldi import khg, kfst
"""

from __future__ import annotations

import kaldi_hmm_gmm as khg  # noqa: I001  (must come first)
import _kaldi_hmm_gmm as khg_ext  # loaded by kaldi_hmm_gmm; holds mle_diag_gmm_update
import kaldifst as kfst
import kaldilm

__all__ = ["fst_arcs", "kaldilm", "kfst", "khg", "khg_ext", "map_input_labels"]


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


def map_input_labels(fst, labels: set[int]):
    """A copy of ``fst`` whose input labels in ``labels`` become epsilon (``fstrmsymbols``)."""
    out = kfst.StdVectorFst()
    states = kfst.StateIterator(fst)
    count = 0
    while not states.done:
        out.add_state()
        count += 1
        states.next()
    out.start = fst.start
    states = kfst.StateIterator(fst)
    while not states.done:
        s = states.value
        out.set_final(s, fst.final(s))
        arcs = kfst.ArcIterator(fst, s)
        while not arcs.done:
            a = arcs.value
            out.add_arc(s, kfst.StdArc(0 if a.ilabel in labels else a.ilabel, a.olabel, a.weight, a.nextstate))
            arcs.next()
        states.next()
    return out
