"""corpus.extra_training: other corpora's utterances join every training split, and only training."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from asrflow.config.schema import ConfigError
from asrflow.data import read_data_dir
from asrflow.data.datadir import extra_utterances, own_texts
from asrflow.data.holdout import held_out_utterances
from asrflow.data.stage import prepare_data
from asrflow.decode.tune import held_out_lang
from asrflow.lang.stage import prepare_lang

from ..conftest import make_config, write_wav


def _corpus(root: Path, rows: list[tuple[str, str, str, str]]) -> dict[str, str]:
    """A tsv corpus of ``(file, transcript, speaker, split)`` rows; every file but ``broken*`` is a real wav."""
    for i, (name, *_rest) in enumerate(rows):
        if name.startswith("broken"):
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text("not audio")
        else:
            write_wav(root / name, 0.4 + 0.05 * i, freq=200 + 40 * i)
    tsv = root / "transcripts.tsv"
    tsv.write_text("".join("\t".join(r) + "\n" for r in rows))
    return {"name": "tsv", "path": str(root), "transcripts": str(tsv)}


def _config(tmp_path: Path, **sections) -> dict:
    own = _corpus(tmp_path / "own", [(f"{s}{i}.wav", "one two" if i % 2 else "two", s, "test" if i == 0 else "train")
                                     for s in ("ann", "bob") for i in range(4)])
    extra = _corpus(tmp_path / "extra", [
        ("p1.wav", "press one for sales", "eve", "train"),
        ("p2.wav", "goodbye", "eve", "test"),        # an extra corpus's test split trains too
        ("broken.wav", "hello", "eve", "train"),     # corrupt: rejected and reported
        ("ann0.wav", "two", "ann", "train"),         # ann-ann0 is an id of the experiment's corpus
        ("x.wav", "two two", "bob", "train"),        # bob is a speaker of the experiment's corpus
    ])
    return make_config(tmp_path, corpus={**own, "extra_training": [extra]}, **sections)


def test_extra_utterances_train_and_are_reported(tmp_path: Path, dask_client_1) -> None:
    config = _config(tmp_path, audio={"sample_rate": 8000, "speed_perturb": [0.9, 1.0]})
    out = tmp_path / "data"
    summary = prepare_data(config, out, dask_client_1, log=lambda *_: None)
    extra = {"eve-p1", "eve-p2"}
    for split in ("train", "train_sp", "all"):
        utts = {u.utt_id: u for u in read_data_dir(out / split)}
        assert extra <= set(utts), split
        assert {u for u, x in utts.items() if x.corpus} == extra_utterances(out / split)
    assert extra_utterances(out / "train_sp") == extra | {"sp0.9-eve-p1", "sp0.9-eve-p2"}
    assert not extra & {u.utt_id for u in read_data_dir(out / "test")}
    assert not (out / "test" / "utt2corpus").exists()
    assert set(own_texts(out / "train")) == {f"{s}-{s}{i}" for s in ("ann", "bob") for i in (1, 2, 3)}
    assert (out / "train" / "utt2corpus").read_text() == "eve-p1 tsv_en\neve-p2 tsv_en\n"
    with open(out / "report.tsv", encoding="utf-8") as handle:
        reasons = {r["utt_id"]: r["reason"] for r in csv.DictReader(handle, delimiter="\t")}
    assert "cannot decode" in reasons["eve-broken"]
    assert "duplicate utterance id" in reasons["ann-ann0"] and "tsv_en" in reasons["ann-ann0"]
    assert "duplicate speaker id bob" in reasons["bob-x"]
    assert summary.extra_training == {"tsv_en": {"utterances": 2, "speakers": 1, "hours": summary.extra_training[
        "tsv_en"]["hours"], "rejected": 3}}
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["extra_training"]["tsv_en"]["rejected"] == 3
    assert manifest["rejected_by_reason"]["duplicate speaker id"] == 1


def test_an_extra_corpus_can_stay_out_of_speed_perturbation(tmp_path: Path, dask_client_1) -> None:
    config = _config(tmp_path, audio={"sample_rate": 8000, "speed_perturb": [0.9, 1.0, 1.1]})
    config["corpus"]["extra_training"][0]["speed_perturb"] = False
    out = tmp_path / "data"
    prepare_data(config, out, dask_client_1, log=lambda *_: None)
    perturbed = {u.utt_id for u in read_data_dir(out / "train_sp")}
    assert extra_utterances(out / "train_sp") == {"eve-p1", "eve-p2"}  # once each, at speed 1
    own = {u.utt_id for u in read_data_dir(out / "train")} - {"eve-p1", "eve-p2"}
    assert perturbed == {"eve-p1", "eve-p2"} | own | {f"sp{f}-{u}" for f in ("0.9", "1.1") for u in own}


def test_the_lm_held_out_and_tuning_are_the_own_corpus(tmp_path: Path, dask_client_1) -> None:
    config = _config(tmp_path, lang={"lexicon": "grapheme", "lm_order": 2}, nnet={"valid_fraction": 0.45})
    prepare_data(config, tmp_path / "data", dask_client_1, log=lambda *_: None)
    report = prepare_lang(config, tmp_path / "data", "train", ["test"], tmp_path / "lang", log=lambda *_: None)
    lexicon = (tmp_path / "lang" / "lexicon.txt").read_text()
    assert "goodbye g.g" in lexicon and "sales g.s" in lexicon  # the extra words can be aligned
    arpa = (tmp_path / "lang" / "lm.arpa").read_text()
    assert "goodbye" not in arpa and "press" not in arpa and "one two" in arpa
    assert report["words"] == 2 and report["extra_training_words"] == 4
    held = held_out_utterances(config, tmp_path / "data", "train")
    assert len(held) == 3 and not held & extra_utterances(tmp_path / "data" / "train")
    _, vocabulary = held_out_lang(config, tmp_path / "lang", tmp_path / "data", "train", held, tmp_path / "tune")
    assert vocabulary <= {"one", "two"}


def test_without_extra_corpora_nothing_changes(tmp_path: Path) -> None:
    """The key's default leaves every stage fingerprint as it was (adding it reran nothing)."""
    from asrflow.workflow import stage_fingerprint

    config = make_config(tmp_path)
    plain = stage_fingerprint(config, "data")
    config["corpus"]["extra_training"] = [{"name": "yesno", "language": "en", "path": None, "transcripts": None,
                                           "download_dir": "downloads", "speed_perturb": True}]
    assert stage_fingerprint(config, "data") != plain
    config["corpus"]["extra_training"] = []
    assert stage_fingerprint(config, "data") == plain


def test_a_typo_in_an_extra_corpus_names_the_key(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"corpus\.extra_training\.0\.lang' \(did you mean 'language'\?\)"):
        make_config(tmp_path, corpus={"name": "fsdd", "extra_training": [{"name": "asterisk", "lang": "en"}]})
    with pytest.raises(ConfigError, match=r"corpus\.extra_training\.0\.name': 'asterix' is not one of"):
        make_config(tmp_path, corpus={"name": "fsdd", "extra_training": [{"name": "asterix"}]})
