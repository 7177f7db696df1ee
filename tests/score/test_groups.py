"""WER per group of speakers (evaluation.groups), from the test split's spk2<attribute> tables."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from asrflow.data.datadir import DataDirError
from asrflow.data.groups import speaker_groups
from asrflow.lang.stage import lm_has_transcripts, lm_source
from asrflow.score.stage import score_split


def _split(root: Path) -> Path:
    test = root / "data" / "test"
    test.mkdir(parents=True)
    (test / "text").write_text("a1 one two\na2 three\nb1 four five six\nc1 seven\n")
    (test / "utt2spk").write_text("a1 a\na2 a\nb1 b\nc1 c\n")
    (test / "spk2gender").write_text("a f\nb m\nc f\n")
    (test / "spk2age").write_text("a 8\nb 30\nc 15\n")
    return test


def _decode_and_lang(root: Path, hyps: str, words: list[str]) -> tuple[Path, Path]:
    """A decode folder with ``hyps`` and a lang folder whose LM has ``words``."""
    decode, lang = root / "decode", root / "lang"
    decode.mkdir()
    (decode / "hyp.txt").write_text(hyps)
    (decode / "manifest.json").write_text(json.dumps({"rtf": 0.1, "failed": []}))
    lang.mkdir()
    unigrams = "".join(f"-1 {w}\n" for w in ["<s>", "</s>", *words])
    (lang / "lm.arpa").write_text(f"\\data\\\nngram 1={len(words) + 2}\n\n\\1-grams:\n{unigrams}\n\\end\\\n")
    return decode, lang


def test_groups_by_value_and_by_numeric_range(tmp_path: Path) -> None:
    test = _split(tmp_path)
    groups = speaker_groups(test, {"gender": {}, "age": {"edges": [16], "labels": ["child", "adult"]}})
    assert groups == {"gender": {"a": "f", "b": "m", "c": "f"}, "age": {"a": "child", "b": "adult", "c": "child"}}
    assert speaker_groups(test, {"age": {"edges": [10, 20]}})["age"] == {"a": "min-10", "b": "20-max", "c": "10-20"}
    with pytest.raises(DataDirError, match="1 edges need 2 labels, not 3"):
        speaker_groups(test, {"age": {"edges": [16], "labels": ["x", "y", "z"]}})
    with pytest.raises(DataDirError, match="spk2accent is missing"):
        speaker_groups(test, {"accent": {}})


def test_score_reports_wer_per_group(tmp_path: Path) -> None:
    _split(tmp_path)
    decode, lang = _decode_and_lang(tmp_path, "a1 one two\na2 tree\nb1 four five six\nc1 seven seven\n", ["one", "two"])
    summary = score_split(tmp_path / "data", "test", decode, lang, tmp_path / "score.json", log=lambda m: None,
                          groups={"gender": {}, "age": {"edges": [16], "labels": ["child", "adult"]}})
    assert summary["errors"] == 2 and summary["n_ref_words"] == 7
    assert summary["groups"]["gender"]["f"] == {"wer": 0.5, "ser": 2 / 3, "errors": 2, "n_ref_words": 4, "n_utts": 3}
    assert summary["groups"]["gender"]["m"]["wer"] == 0.0
    assert summary["groups"]["age"]["child"]["errors"] == 2 and summary["groups"]["age"]["adult"]["n_utts"] == 1
    assert json.loads((tmp_path / "score.json").read_text())["groups"] == summary["groups"]


def test_score_splits_sentences_the_lm_was_trained_on_from_new_ones(tmp_path: Path) -> None:
    _split(tmp_path)
    train = tmp_path / "data" / "train"
    train.mkdir()
    (train / "text").write_text("t1 one two\nt2 seven\nt3 eight nine\n")
    decode, lang = _decode_and_lang(tmp_path, "a1 one\na2 three\nb1 four five six\nc1 seven\n", ["one"])
    score = lambda split: score_split(tmp_path / "data", "test", decode, lang, tmp_path / "score.json",  # noqa: E731
                                      log=lambda m: None, sentences=split)
    assert "sentences" not in score(True)  # the lang names no training split
    (lang / "manifest.json").write_text(json.dumps({"train": "train"}))
    assert "sentences" not in score(False)  # an LM not estimated from the transcripts (lm_has_transcripts)
    sentences = score(True)["sentences"]
    assert sentences["seen"] == {"wer": 1 / 3, "ser": 0.5, "errors": 1, "n_ref_words": 3, "n_utts": 2}
    assert sentences["new"] == {"wer": 0.0, "ser": 0.0, "errors": 0, "n_ref_words": 4, "n_utts": 2}


def test_only_an_external_arpa_used_as_given_leaves_the_transcripts_out_of_the_lm() -> None:
    lang = {"lm_combine": "pool", "lm_arpa": None, "lm_text": []}
    assert lm_has_transcripts(lang) and lm_source(lang) == "transcripts"
    given = {**lang, "lm_arpa": "big.arpa"}
    assert not lm_has_transcripts(given) and lm_source(given) == "big.arpa"
    assert lm_has_transcripts({**lang, "lm_combine": "interpolate", "lm_arpa": "big.arpa"})
