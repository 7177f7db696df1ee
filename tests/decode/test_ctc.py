"""CTC prefix beam search: collapsing rules, LM fusion and agreement with exhaustive search."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np

from asrflow.decode.ctc import SearchOptions, prefix_beam_search
from asrflow.lang.lm import ArpaLM, KneserNeyLM

PIECES = ["<blank>", "\u2581a", "b", "\u2581c"]
STARTS = np.array([False, True, False, True])


def _posteriors(path: list[int], classes: int = 4, peak: float = 0.97) -> np.ndarray:
    p = np.full((len(path), classes), (1 - peak) / (classes - 1))
    p[np.arange(len(path)), path] = peak
    return np.log(p)


def test_repeats_collapse_unless_a_blank_separates_them() -> None:
    opts = SearchOptions(lm_weight=0.0, word_bonus=0.0)
    assert prefix_beam_search(_posteriors([1, 1, 0, 2, 3, 0]), PIECES, STARTS, None, opts) == ["ab", "c"]
    assert prefix_beam_search(_posteriors([2, 2, 0, 2]), PIECES, STARTS, None, opts) == ["bb"]
    assert prefix_beam_search(_posteriors([0, 0, 0]), PIECES, STARTS, None, opts) == []


def _collapse(path: tuple[int, ...]) -> tuple[int, ...]:
    out = [c for i, c in enumerate(path) if c and (i == 0 or c != path[i - 1])]
    return tuple(out)


def test_without_lm_it_finds_the_most_probable_labelling() -> None:
    """On random posteriors over 5 frames, a wide beam returns the exhaustive-search optimum."""
    rng = np.random.default_rng(0)
    for _ in range(5):
        logp = np.log(rng.dirichlet(np.ones(4) * 0.7, size=5))
        totals: dict[tuple, float] = {}
        for path in itertools.product(range(4), repeat=5):
            label = _collapse(path)
            totals[label] = np.logaddexp(totals.get(label, -np.inf), sum(logp[t, c] for t, c in enumerate(path)))
        best = max(totals, key=totals.get)
        words = prefix_beam_search(logp, PIECES, STARTS, None, SearchOptions(beam=64, lm_weight=0, word_bonus=0,
                                                                               prune=-50, blank_skip=0))
        text = "".join(PIECES[c] for c in best).replace("\u2581", " ").split()
        assert words == text


def test_the_lm_picks_the_word_it_knows(tmp_path: Path) -> None:
    """Acoustically ambiguous between "a" and "c": the LM trained on "c" decides."""
    KneserNeyLM([["c"]] * 5, order=2, vocabulary=["a", "c"]).write_arpa(tmp_path / "lm.arpa")
    lm = ArpaLM(tmp_path / "lm.arpa")
    logp = np.log(np.array([[0.02, 0.50, 0.01, 0.47], [0.9, 0.04, 0.02, 0.04]]))
    assert prefix_beam_search(logp, PIECES, STARTS, None, SearchOptions(lm_weight=0)) == ["a"]
    assert prefix_beam_search(logp, PIECES, STARTS, lm, SearchOptions(lm_weight=1.0)) == ["c"]


def test_arpa_reader_matches_the_estimated_model(tmp_path: Path) -> None:
    sentences = [s.split() for s in ("a b c", "a b", "b c a", "c c b a")]
    lm = KneserNeyLM(sentences, order=3)
    lm.write_arpa(tmp_path / "lm.arpa")
    arpa = ArpaLM(tmp_path / "lm.arpa", oov_logprob=-20.0)
    for word, history in (("a", ("<s>",)), ("b", ("a",)), ("c", ("a", "b")), ("</s>", ("b", "c")), ("a", ("c", "c"))):
        assert math.isclose(arpa.logprob(word, history), math.log(lm.prob(word, history)), abs_tol=1e-5)
    assert arpa.logprob("zzz", ("a",)) == -20.0


def test_a_closed_vocabulary_writes_only_the_lm_words(tmp_path: Path) -> None:
    """"ab" is spelt clearly but is not a word of the LM: the closed search writes "a" or nothing instead."""
    from asrflow.decode.ctc import Vocabulary, vocabulary_for

    KneserNeyLM([["a", "c"]] * 5, order=2, vocabulary=["a", "c"]).write_arpa(tmp_path / "lm.arpa")
    lm = ArpaLM(tmp_path / "lm.arpa")
    vocabulary = vocabulary_for(SearchOptions(vocabulary="closed"), lm)
    assert vocabulary.words == {"a", "c"} and vocabulary.prefixes == {"a", "c"}
    assert vocabulary_for(SearchOptions(), lm) is None  # open: any spelling
    opts = SearchOptions(lm_weight=0.0, word_bonus=0.0, vocabulary="closed")
    spelt = _posteriors([1, 0, 2, 0, 3])  # a, b, c: "ab c" when open
    assert prefix_beam_search(spelt, PIECES, STARTS, None, SearchOptions(lm_weight=0.0, word_bonus=0.0)) == ["ab", "c"]
    assert prefix_beam_search(spelt, PIECES, STARTS, None, opts, vocabulary) == ["a", "c"]
    only_b = prefix_beam_search(_posteriors([2, 2, 0]), PIECES, STARTS, None, opts, vocabulary)
    assert only_b and set(only_b) <= {"a", "c"}  # "b" alone is no word: the next most probable words instead
    longer = Vocabulary.of(["ab", "<unk>", "</s>"])
    assert longer.words == {"ab"} and longer.prefixes == {"a", "ab"}
    assert prefix_beam_search(spelt, PIECES, STARTS, None, opts, longer) == ["ab"]  # "c" is no word of it
