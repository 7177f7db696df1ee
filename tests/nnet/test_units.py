"""CTC units: sentencepiece BPE and characters, blank at 0, round trip to text."""

from __future__ import annotations

import pytest

from asrflow.nnet.units import Units

TEXTS = ["zero one two", "three four five six", "seven eight nine", "oh"] * 10


@pytest.mark.parametrize("kind", ["bpe", "char"])
def test_round_trip_and_numbering(kind: str) -> None:
    units = Units.train(TEXTS, kind, vocab_size=24)
    ids = units.encode("nine one oh")
    assert ids.min() >= 1 and ids.max() < units.num_classes  # 0 is the blank
    assert units.decode(ids) == "nine one oh"
    assert units.pieces[0] == "<blank>" and units.word_start[ids[0]]
    again = Units(units.model)
    assert again.encode("two six").tolist() == units.encode("two six").tolist()


def test_bpe_merges_and_char_does_not() -> None:
    bpe, char = Units.train(TEXTS, "bpe", 40), Units.train(TEXTS, "char")
    assert len(bpe.encode("seven eight")) < len(char.encode("seven eight"))
    assert all(len(p.lstrip("\u2581")) <= 1 for p in char.pieces if not p.startswith("<"))


def test_no_text_is_an_error() -> None:
    with pytest.raises(ValueError, match="no non-empty transcripts"):
        Units.train(["", "  "], "bpe")
