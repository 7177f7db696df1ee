"""The lang stage with a corpus's own lexicon (speechocean762's), and the config checks of lexicon files."""

from __future__ import annotations

from pathlib import Path

import pytest

from asrflow.config import ConfigError
from asrflow.corpus import CorpusError
from asrflow.data.stage import prepare_data
from asrflow.lang.stage import prepare_lang
from tests.conftest import make_config


def test_speechocean762_lang_from_its_own_lexicon(use_mirror: Path, tmp_path: Path, dask_client_1) -> None:
    config = make_config(tmp_path, corpus={"name": "speechocean762", "path": str(use_mirror / "speechocean762-mini")},
                         audio={"sample_rate": 16000}, lang={"lexicon": "corpus"})
    prepare_data(config, tmp_path / "data", dask_client_1, log=lambda *_: None)
    report = prepare_lang(config, tmp_path / "data", "train", ["test"], tmp_path / "lang", log=lambda *_: None)
    assert report["lexicon"] == "corpus" and report["grapheme_fallback_words"] == 0
    assert report["phones"] == 39  # CMU phones, stress stripped
    assert 0 < report["test_sets"]["test"]["oov_rate"] < 0.5  # unseen test speakers say unseen words
    lexicon = (tmp_path / "lang" / "lexicon.txt").read_text().splitlines()
    assert "mark M AA R K" in lexicon
    kept = make_config(tmp_path, corpus=config["corpus"], audio={"sample_rate": 16000},
                       lang={"lexicon": "corpus", "stress": "keep"})
    assert prepare_lang(kept, tmp_path / "data", "train", [], tmp_path / "lang_kept", log=lambda *_: None)[
        "phones"] > 39


def test_lexicon_file_settings_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="'lang.lexicon_file': give it exactly when lang.lexicon is file"):
        make_config(tmp_path, lang={"lexicon": "file"})
    with pytest.raises(ConfigError, match="'lang.lexicon_file'"):
        make_config(tmp_path, lang={"lexicon": "cmudict", "lexicon_file": "x.txt"})
    config = make_config(tmp_path, lang={"lexicon": "corpus"})  # yesno ships no lexicon
    (tmp_path / "data" / "train").mkdir(parents=True)
    (tmp_path / "data" / "train" / "text").write_text("u yes no\n")
    with pytest.raises(CorpusError, match="the yesno recipe has no lexicon of its own"):
        prepare_lang(config, tmp_path / "data", "train", [], tmp_path / "lang", log=lambda *_: None)
