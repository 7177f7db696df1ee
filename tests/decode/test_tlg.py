"""CTC over phones: units spelled with the lexicon, the TLG graph and Kaldi's decoder through it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from asrflow.config.settings import decoder_kind
from asrflow.decode.decoder import DecodeOptions, decode_all
from asrflow.decode.stage import make_graph
from asrflow.kaldi import khg
from asrflow.lang.stage import prepare_lang
from asrflow.nnet.units import PhoneUnits

from ..conftest import make_config

TEXTS = {"a": "yes no yes", "b": "no no", "c": "yes yes no", "d": "no yes"}


@pytest.fixture(scope="module")
def lang(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("tlg")
    (tmp / "data" / "train").mkdir(parents=True)
    (tmp / "data" / "train" / "text").write_text("".join(f"{u} {t}\n" for u, t in TEXTS.items()))
    config = make_config(tmp, lang={"lexicon": "grapheme", "lm_order": 2})
    prepare_lang(config, tmp / "data", "train", [], tmp / "lang", log=lambda *_: None)
    make_graph(tmp / "lang", None, tmp / "graph", log=lambda *_: None)
    return tmp


def _posteriors(units: PhoneUnits, frames: list[str]) -> np.ndarray:
    """Log posteriors that make each frame's unit ("-" = blank) nearly certain."""
    out = np.full((len(frames), units.num_classes), np.log(1e-4), dtype=np.float32)
    for t, piece in enumerate(frames):
        out[t, 0 if piece == "-" else units.pieces.index(piece)] = np.log(0.999)
    return out


def test_phone_units_spell_words_with_the_lexicon(lang: Path) -> None:
    units = PhoneUnits.from_lang(lang / "lang")
    assert units.pieces == ["<blank>", "g.e", "g.n", "g.o", "g.s", "g.y"] and units.num_classes == 6
    assert [units.pieces[c] for c in units.encode("yes no")] == ["g.y", "g.e", "g.s", "g.n", "g.o"]
    assert units.encode("yes maybe").size == 0  # a word the lexicon cannot spell: no units
    assert units.model.decode().split() == units.phones


@pytest.mark.parametrize("frames, words", [
    ("- - g.y g.y g.e - g.s - - g.n g.o g.o -", "yes no"),
    ("g.n g.o - g.n g.n g.o g.o - - g.y g.e g.s g.s", "no no yes"),
    ("- g.y g.e g.s g.y g.e g.e g.s - g.n - g.o", "yes yes no"),  # no blank needed between different units
])
def test_tlg_decodes_ctc_posteriors_into_words(lang: Path, frames: str, words: str) -> None:
    units = PhoneUnits.from_lang(lang / "lang")
    post = _posteriors(units, frames.split())
    items = [("u", len(post), lambda: khg.DecodableCtc(post))]
    result = decode_all(str(lang / "graph" / "TLG.fst"), DecodeOptions(beam=13.0, max_active=1000), items)
    assert result.hyps["u"] == words.split() and not result.failed


def test_a_repeated_unit_without_blank_is_one_unit(lang: Path) -> None:
    """CTC collapsing: "g.n g.n g.o" is n-o once; "no no" needs the blank or another unit between."""
    units = PhoneUnits.from_lang(lang / "lang")
    post = _posteriors(units, ["g.n", "g.n", "g.o", "g.o", "g.o"])
    result = decode_all(str(lang / "graph" / "TLG.fst"), DecodeOptions(),
                        [("u", len(post), lambda: khg.DecodableCtc(post))])
    assert result.hyps["u"] == ["no"]


def test_phone_ctc_networks_decode_through_tlg() -> None:
    assert decoder_kind({"objective": "ctc", "units": "phone"}) == "tlg"
    assert decoder_kind({"objective": "ctc", "units": "bpe"}) == "prefix"
    assert decoder_kind({"objective": "hybrid", "units": "bpe"}) == "hclg"


def test_the_tlg_search_ends_in_a_final_state(tmp_path: Path) -> None:
    """The faster decoder's best path honours the graph's final states: more likely frames down a path that
    never ends (word "bad") lose to the path that does (word "good")."""
    from asrflow.kaldi import kfst

    graph = kfst.StdVectorFst()
    for _ in range(4):
        graph.add_state()
    graph.start = 0
    graph.add_arc(0, kfst.StdArc(1, 1, 0.0, 1))  # unit 0 then epsilon into the final state: "good"
    graph.add_arc(1, kfst.StdArc(1, 0, 0.0, 1))
    graph.add_arc(1, kfst.StdArc(0, 0, 0.0, 3))
    graph.set_final(3, 0.0)
    graph.add_arc(0, kfst.StdArc(2, 2, 0.0, 2))  # unit 1 forever, no final state: "bad"
    graph.add_arc(2, kfst.StdArc(2, 0, 0.0, 2))
    graph.write(str(tmp_path / "TLG.fst"))
    (tmp_path / "words.txt").write_text("<eps> 0\ngood 1\nbad 2\n")
    post = np.log(np.array([[0.3, 0.7]] * 6, dtype=np.float32))
    result = decode_all(str(tmp_path / "TLG.fst"), DecodeOptions(),
                        [("u", len(post), lambda: khg.DecodableCtc(post))])
    assert result.hyps["u"] == ["good"] and result.partial == []
    narrow = decode_all(str(tmp_path / "TLG.fst"), DecodeOptions(max_active=5),  # fewer than decoder.MIN_ACTIVE
                        [("u", len(post), lambda: khg.DecodableCtc(post))])
    assert narrow.hyps == result.hyps
    with pytest.raises(ValueError, match="max_active is 1"):
        decode_all(str(tmp_path / "TLG.fst"), DecodeOptions(max_active=1), [])
    # without the final state: the best partial path, and the utterance listed as partial
    graph.set_final(3, float("inf"))
    graph.write(str(tmp_path / "TLG.fst"))
    result = decode_all(str(tmp_path / "TLG.fst"), DecodeOptions(), [("u", len(post), lambda: khg.DecodableCtc(post))])
    assert result.hyps["u"] == ["bad"] and result.partial == ["u"] and result.failed == []
