"""Named LM texts (``lang.lm_text: [nltk:brown]``): read from a mirror laid out as the NLTK data collection,
tags stripped, unknown names and missing archives named in the error."""

from __future__ import annotations

import zipfile

import pytest

from asrflow.text.sources import FOLDER, TextSourceError, is_named, named_sentences


def _zip(path, members: dict[str, str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in members.items():
            zf.writestr(name, text)


def test_brown_sentences_lose_their_tags_and_other_members_are_skipped(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("ASRFLOW_DATA_MIRROR", str(tmp_path))
    _zip(tmp_path / FOLDER / "brown.zip", {
        "brown/README": "The Brown Corpus/np of/in ...\n",
        "brown/cats.txt": "ca01 news\n",
        "brown/ca01": "\n\n\tThe/at Fulton/np-tl County/nn-tl said/vbd ./.\n\n\tIt/pps ended/vbd 3/cd-hl ./.\n",
    })
    _zip(tmp_path / FOLDER / "movie_reviews.zip", {"movie_reviews/pos/cv000_1.txt": "a fine film .\nsee it !\n",
                                                   "movie_reviews/README": "not a review\n"})
    assert is_named("nltk:brown") and not is_named("texts/brown.txt")
    assert [s for s in named_sentences("nltk:brown", tmp_path / "dl") if s] == [
        "The Fulton County said .", "It ended 3 ."]
    assert named_sentences("nltk:movie_reviews", tmp_path / "dl") == ["a fine film .", "see it !"]
    with pytest.raises(TextSourceError, match="unknown corpus; known: nltk:brown, nltk:movie_reviews"):
        named_sentences("nltk:gutenberg", tmp_path)
    (tmp_path / FOLDER / "brown.zip").unlink()
    with pytest.raises(TextSourceError, match="the mirror has no nltk_data/packages/corpora/brown.zip"):
        named_sentences("nltk:brown", tmp_path)


def test_the_lang_stage_reads_a_named_corpus_from_the_mirror(tmp_path, monkeypatch) -> None:
    from asrflow.lang.stage import text_sentences

    monkeypatch.setenv("ASRFLOW_DATA_MIRROR", str(tmp_path))
    _zip(tmp_path / FOLDER / "brown.zip", {"brown/cb02": "\tTwo/cd birds/nns sang/vbd ./.\n"})
    assert text_sentences("nltk:brown", "en", tmp_path) == ["two birds sang"]
