"""LM interpolation: the static mixture against the linear formula, the EM weights against a brute-force
search, the vocabulary limit, and the lang stage's ``lm_combine: interpolate``."""

from __future__ import annotations

import math

import pytest

from asrflow.lang.arpa import LmError
from asrflow.lang.lm import KneserNeyLM
from asrflow.lang.mix import limit_vocabulary, mix_arpa, mix_weights, mixture_perplexity, token_probs

IN_DOMAIN = ["the cat sat on the mat", "the dog sat on the log", "a cat and a dog", "the cat ate",
             "on the mat the cat sat", "a dog sat", "the log", "the mat and the log"]
GENERAL = ["a bird sat on a tree", "the bird ate the seed", "a dog ate the bird", "birds sing in the tree",
           "the tree and the log", "a cat sat on the tree", "the seed fell"]


def _model(sentences, order=3):
    return KneserNeyLM([s.split() for s in sentences], order).arpa()


def _sums(model) -> list[float]:
    """Σ_w p(w | h) over the vocabulary and </s>, for the empty history and every history the model lists."""
    vocab = sorted(model.words | {"</s>"})
    histories = {g[:-1] for g in model.prob if len(g) > 1} | {()}
    return [sum(10 ** model.log10p(w, h) for w in vocab) for h in histories]


def test_the_mixture_lists_the_linear_interpolation_and_every_distribution_sums_to_one() -> None:
    a, b = _model(IN_DOMAIN), _model(GENERAL)
    mixed = mix_arpa([a, b], [0.7, 0.3])
    assert set(mixed.prob) == set(a.prob) | set(b.prob)
    for gram in [("the", "cat", "sat"), ("a", "bird"), ("bird",), ("the", "log", "</s>")]:
        expected = sum(lam * (10 ** m.log10p(gram[-1], gram[:-1]) if gram[-1] in m.words | {"</s>"} else 0.0)
                       for lam, m in ((0.7, a), (0.3, b)))
        assert 10 ** mixed.prob[gram] == pytest.approx(expected, rel=1e-9)
    assert 10 ** mixed.prob[("bird",)] == pytest.approx(0.3 * 10 ** b.prob[("bird",)], rel=1e-9)  # a lacks it
    assert all(s == pytest.approx(1.0, abs=1e-9) for s in _sums(mixed))
    assert mix_arpa([a, b], [1.0, 0.0]).perplexity([s.split() for s in IN_DOMAIN]) == pytest.approx(
        a.perplexity([s.split() for s in IN_DOMAIN]), rel=1e-6)


def test_em_weights_maximise_the_held_out_likelihood() -> None:
    a, b = _model(IN_DOMAIN), _model(GENERAL)
    held = [s.split() for s in ["the cat sat on the log", "a bird sat on the mat", "the dog ate"]]
    weights, perplexity = mix_weights([a, b], held)
    assert sum(weights) == pytest.approx(1.0) and 0 < weights[0] < 1
    rows = token_probs([a, b], held)
    grid = [mixture_perplexity(rows, [x / 100, 1 - x / 100]) for x in range(1, 100)]
    assert perplexity <= min(grid) + 1e-6
    assert perplexity == pytest.approx(mixture_perplexity(rows, weights))
    # text only one model could have written puts nearly all weight on it
    assert mix_weights([a, b], [s.split() for s in IN_DOMAIN])[0][0] > 0.9


def test_limiting_the_vocabulary_drops_its_n_grams_and_renormalises() -> None:
    b = _model(GENERAL)
    limited = limit_vocabulary(b, {"the", "a", "bird", "sat", "on", "tree"})
    assert limited.words == {"the", "a", "bird", "sat", "on", "tree"}
    assert all(w in limited.words | {"<s>", "</s>"} for g in limited.prob for w in g)
    assert all(s == pytest.approx(1.0, abs=1e-9) for s in _sums(limited))
    with pytest.raises(LmError, match="no word"):
        limit_vocabulary(b, {"zebra"})
    with pytest.raises(LmError, match="sum to one"):
        mix_arpa([b, b], [0.7, 0.7])


def _lang(tmp_path, **lang):
    from asrflow.lang.stage import prepare_lang
    from tests.conftest import make_config

    data = tmp_path / "data"
    for split, texts in (("train", IN_DOMAIN * 3), ("test", ["the bird sat on the tree"])):
        (data / split).mkdir(parents=True, exist_ok=True)
        (data / split / "text").write_text("".join(f"{split}{i:02d} {t}\n" for i, t in enumerate(texts)))
    extra = tmp_path / "general.txt"
    extra.write_text("\n".join(GENERAL + ["a zqxv sat on the tree"]) + "\n")
    config = make_config(tmp_path, corpus={"name": "yesno"},
                         lang={"lexicon": "cmudict", "lm_text": [str(extra)], "lm_combine": "interpolate", **lang})
    out = tmp_path / f"lang{len(list(tmp_path.glob('lang*')))}"
    return prepare_lang(config, data, "train", ["test"], out, log=lambda *_: None), out


def test_the_lang_stage_interpolates_the_transcripts_with_a_general_text(tmp_path) -> None:
    report, out = _lang(tmp_path)
    mix = report["lm_mix"]
    assert mix["components"] == ["transcripts", str(tmp_path / "general.txt")]
    assert sum(mix["weights"]) == pytest.approx(1.0, abs=1e-3)
    assert mix["held_out"]["sentences"] == 3 and math.isfinite(mix["held_out"]["perplexity"])
    assert report["lm_source"] == f"transcripts + {tmp_path / 'general.txt'} (interpolated)"
    words = set((out / "words.txt").read_text().split()[::2])
    assert {"bird", "tree", "cat"} <= words and "zqxv" not in words  # no pronunciation but its letters
    assert report["test_sets"]["test"]["oov_rate"] == 0.0 and report["grapheme_fallback_words"] == 0
    report, out = _lang(tmp_path, lm_weights=[0.9, 0.1], lm_vocabulary=12)
    assert report["words"] == 12 and report["lm_mix"]["weights"] == [0.9, 0.1] and "held_out" not in report["lm_mix"]
    with pytest.raises(LmError, match="3 weights for 2 models"):
        _lang(tmp_path, lm_weights=[0.2, 0.3, 0.5])
    with pytest.raises(LmError, match="neither"):
        _lang(tmp_path, lm_text=[])
    report, _ = _lang(tmp_path, lm_text=[], lm_arpa=str(out / "lm.arpa"))  # an ARPA model as the other component
    assert report["lm_mix"]["components"] == ["transcripts", str(out / "lm.arpa")] and report["words"] == 12
