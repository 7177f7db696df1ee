import math
from pathlib import Path

import pytest

from asrflow.lang.lexicon import OOV_WORD, SIL_WORD, LexiconError, build_lexicon, oov_rate, phone_inventory
from asrflow.lang.lm import KneserNeyLM

SENTS = [s.split() for s in ["press one", "press two for help", "one two three", "help", "press one now"]]


@pytest.mark.parametrize("order", [1, 2, 3, 4])
def test_kn_distributions_sum_to_one(order: int) -> None:
    lm = KneserNeyLM(SENTS, order)
    for history in [(), ("<s>",), ("press",), ("press", "one"), ("unseen", "words")]:
        assert sum(lm.prob(w, history) for w in lm.vocab) == pytest.approx(1.0, abs=1e-9)


def test_kn_prefers_seen_continuations_and_backoff_weights_are_not_positive(tmp_path: Path) -> None:
    lm = KneserNeyLM(SENTS, 3)
    assert lm.prob("one", ("press",)) > lm.prob("three", ("press",))
    assert lm.perplexity(SENTS) < KneserNeyLM(SENTS, 1).perplexity(SENTS)
    lm.write_arpa(tmp_path / "lm.arpa")
    text = (tmp_path / "lm.arpa").read_text()
    assert "ngram 3=" in text and "-99.000000\t<s>" in text
    for line in text.splitlines():
        fields = line.split("\t")
        if len(fields) == 3:
            assert float(fields[2]) <= 0.0, line


def test_two_word_corpus_is_not_degenerate() -> None:
    lm = KneserNeyLM([["yes", "no", "yes"], ["no", "no"]], 3)
    assert all(0 < lm.gamma(h) <= 1 for h in [(), ("yes",), ("<s>", "no")])
    assert math.isfinite(lm.perplexity([["yes", "no"]]))


def test_cmudict_with_grapheme_fallback() -> None:
    lexicon, fallback = build_lexicon(["zero", "press", "kilobit", "zyxwv", "don't"], "cmudict")
    assert lexicon["zero"] == [["Z", "IH", "R", "OW"], ["Z", "IY", "R", "OW"]]
    assert lexicon["zyxwv"] == [["g.z", "g.y", "g.x", "g.w", "g.v"]] and fallback == {"zyxwv": "grapheme"}
    assert lexicon[SIL_WORD] == [["SIL"]] and lexicon[OOV_WORD] == [["SPN"]]
    silence, nonsilence = phone_inventory(lexicon)
    assert silence == ["SIL", "SPN"] and "AH" not in silence and "Z" in nonsilence


def test_grapheme_lexicon_any_language() -> None:
    lexicon, fallback = build_lexicon(["écoutez", "año"], "grapheme")
    assert lexicon["año"] == [["g.a", "g.ñ", "g.o"]] and not fallback
    assert oov_rate(["press one", "press nine"], {"press", "one"}) == (0.25, 1, 4)


def test_a_lexicon_file_with_cmudict_and_graphemes_for_what_it_lacks(tmp_path) -> None:
    """A Kaldi lexicon.txt (upper-case words, CMU phones with stress): its pronunciations first, CMUdict's for
    words it lacks, graphemes for words neither has; stress marks stripped or kept alike."""
    from asrflow.lang.lexicon import read_lexicon

    path = tmp_path / "lexicon.txt"
    path.write_text("A\tAH0\nA\tEY1\nMARK\tM AA1 R K\nMARK M AA1 R K\n")
    given = read_lexicon(path)
    assert given == {"a": [["AH0"], ["EY1"]], "mark": [["M", "AA1", "R", "K"]]}
    lexicon, fallbacks = build_lexicon(["a", "mark", "zero", "zyxwv"], "file", given)
    assert lexicon["a"] == [["AH"], ["EY"]] and lexicon["mark"] == [["M", "AA", "R", "K"]]
    assert lexicon["zero"] == [["Z", "IH", "R", "OW"], ["Z", "IY", "R", "OW"]]
    assert fallbacks == {"zero": "cmudict", "zyxwv": "grapheme"}
    kept, _ = build_lexicon(["a", "zero"], "corpus", given, stress="keep")
    assert kept["a"] == [["AH0"], ["EY1"]] and kept["zero"][0] == ["Z", "IH1", "R", "OW0"]
    (tmp_path / "bad.txt").write_text("A AH0\nLONELY\n")
    with pytest.raises(LexiconError, match="bad.txt:2: the word 'LONELY' has no phones"):
        read_lexicon(tmp_path / "bad.txt")
    with pytest.raises(LexiconError, match="not found"):
        read_lexicon(tmp_path / "none.txt")
