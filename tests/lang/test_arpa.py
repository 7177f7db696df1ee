"""ARPA models: reading, writing, the backoff rule, pruning to a size with renormalised backoff weights, and
the lang stage's LM inputs (extra text, an external ARPA file, pruning)."""

from __future__ import annotations

import json
import math

import pytest

from asrflow.lang.arpa import ArpaError, arpa_words, prune_arpa, read_arpa, write_arpa
from asrflow.lang.lm import ArpaLM, KneserNeyLM

SENTENCES = ["the cat sat on the mat", "the dog sat on the log", "a cat and a dog", "the cat ate",
             "on the mat the cat sat", "a dog sat", "the log", "the mat and the log"]


@pytest.fixture
def model(tmp_path):
    KneserNeyLM([s.split() for s in SENTENCES], order=3).write_arpa(tmp_path / "lm.arpa")
    return read_arpa(tmp_path / "lm.arpa")


def _sums(model) -> list[float]:
    """Σ_w p(w | h) over the vocabulary and </s>, for every history the model lists."""
    vocab = sorted(model.words | {"</s>"})
    histories = {g[:-1] for g in model.prob if len(g) > 1}
    return [sum(10 ** model.log10p(w, h) for w in vocab) for h in histories]


def test_backoff_rule_matches_the_reader_used_by_ctc_search(model, tmp_path) -> None:
    reference = ArpaLM(tmp_path / "lm.arpa")
    for history, word in [((), "cat"), (("the",), "cat"), (("the", "cat"), "sat"), (("a", "log"), "the")]:
        assert model.log10p(word, history) * math.log(10) == pytest.approx(reference.logprob(word, history))
    assert all(s == pytest.approx(1.0, abs=1e-4) for s in _sums(model))


def test_write_and_read_round_trip(model, tmp_path) -> None:
    write_arpa(model, tmp_path / "again.arpa")
    again = read_arpa(tmp_path / "again.arpa")
    assert again.counts() == model.counts() and again.words == model.words
    assert all(again.prob[g] == pytest.approx(p, abs=1e-6) for g, p in model.prob.items())


def test_pruning_keeps_the_size_drops_the_least_important_and_renormalises(model) -> None:
    above = sum(model.counts()[1:])
    pruned = prune_arpa(model, above - 10)
    assert sum(pruned.counts()[1:]) == above - 10 and pruned.counts()[0] == model.counts()[0]
    assert all(s == pytest.approx(1.0, abs=1e-4) for s in _sums(pruned))
    text = [s.split() for s in SENTENCES]
    assert model.perplexity(text) < pruned.perplexity(text) < prune_arpa(model, 0).perplexity(text)
    # the trigram a single occurrence supports goes before one every "the cat" makes likely
    dropped = set(model.prob) - set(pruned.prob)
    assert ("<s>", "the", "cat") not in dropped and ("the", "cat", "ate") in dropped
    assert all(g[:-1] in pruned.prob for g in pruned.prob if len(g) > 2)  # every kept n-gram's history kept
    assert prune_arpa(model, 0).order == 1 and prune_arpa(model, above).prob == model.prob


def test_a_small_budget_keeps_the_trigrams_that_matter_more_than_bigrams(model) -> None:
    trigrams = model.counts()[2]
    pruned = prune_arpa(model, trigrams)  # fewer n-grams than the trigrams alone
    assert sum(pruned.counts()[1:]) == trigrams and pruned.order == 3 and pruned.counts()[1] < model.counts()[1]
    assert all(g[:-1] in pruned.prob for g in pruned.prob if len(g) > 2)
    assert all(s == pytest.approx(1.0, abs=1e-4) for s in _sums(pruned))


def test_malformed_arpa_files_are_named(tmp_path) -> None:
    bad = tmp_path / "bad.arpa"
    bad.write_text("\\data\\\nngram 1=1\n\n\\1-grams:\n-1.0\n\\end\\\n")
    with pytest.raises(ArpaError, match=r"bad.arpa:5: not an ARPA 1-gram line"):
        read_arpa(bad)
    with pytest.raises(ArpaError, match="no such ARPA file"):
        read_arpa(tmp_path / "missing.arpa")
    with pytest.raises(ArpaError, match=r"bad.arpa:5: not an ARPA 1-gram line"):
        arpa_words(bad)


def test_the_vocabulary_is_read_from_the_unigrams_alone(model, tmp_path) -> None:
    """arpa_words (what scoring needs) gives the model's words and stops at the bigrams: a malformed line
    there is not reached."""
    write_arpa(model, tmp_path / "lm.arpa")
    assert arpa_words(tmp_path / "lm.arpa") == model.words
    text = (tmp_path / "lm.arpa").read_text().replace("\\2-grams:\n", "\\2-grams:\nnot a bigram line at all\n")
    (tmp_path / "broken.arpa").write_text(text)
    assert arpa_words(tmp_path / "broken.arpa") == model.words


def test_lang_stage_lm_from_extra_text_pruned_or_from_an_arpa_file(tmp_path) -> None:
    from asrflow.lang.stage import prepare_lang
    from tests.conftest import make_config

    data = tmp_path / "data"
    for split, texts in (("train", SENTENCES), ("test", ["the bird sat on the mat"])):
        (data / split).mkdir(parents=True)
        (data / split / "text").write_text("".join(f"{split}{i} {t}\n" for i, t in enumerate(texts)))
    extra = tmp_path / "extra.txt"
    extra.write_text("The bird sat.\n\nA BIRD ATE THE CAT\n")
    config = make_config(tmp_path, corpus={"name": "yesno"}, lang={"lexicon": "grapheme", "lm_text": [str(extra)]})
    report = prepare_lang(config, data, "train", ["test"], tmp_path / "lang", log=lambda *_: None)
    assert report["lm_source"] == "transcripts + lm_text" and report["test_sets"]["test"]["oov_rate"] == 0.0
    assert "\nbird " in (tmp_path / "lang" / "words.txt").read_text()  # normalised, the extra words join
    config["lang"]["lm_max_ngrams"] = 20
    report = prepare_lang(config, data, "train", ["test"], tmp_path / "pruned", log=lambda *_: None)
    assert sum(report["lm_ngrams"][1:]) == 20
    config["lang"].update(lm_arpa=str(tmp_path / "pruned" / "lm.arpa"), lm_text=[], lm_max_ngrams=None)
    report = prepare_lang(config, data, "train", ["test"], tmp_path / "external", log=lambda *_: None)
    assert report["lm_source"].endswith("lm.arpa") and report["lm_ngrams"] == read_arpa(
        tmp_path / "pruned" / "lm.arpa").counts()
    assert json.loads((tmp_path / "external" / "manifest.json").read_text())["words"] == report["words"]
    assert (tmp_path / "external" / "G.fst").stat().st_size > 0
