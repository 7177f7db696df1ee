"""Output units of CTC models: sentencepiece BPE or characters trained on the training
transcripts (:class:`Units`), or the lang's phones (:class:`PhoneUnits`).

Class 0 is the CTC blank; sentencepiece id ``i`` is class ``i + 1``. Word boundaries are
sentencepiece's "▁" prefix, so any unit sequence maps back to words (the prefix beam
search uses that to score words with the n-gram LM). Text is taken as already normalised
(the corpus recipes normalise it), so sentencepiece's own normalisation is switched off.
Phone units are the lang's non-silence phones in ``nonsilence.int`` order (phone ``k`` is
class ``k``, as in the TLG graph of :func:`asrflow.lang.graph.make_tlg`); a transcript is
spelled with each word's first pronunciation in ``lexicon.txt``.
"""

from __future__ import annotations

import io
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import sentencepiece as spm

WORD_START = "\u2581"  # sentencepiece's "▁"
KINDS = ("bpe", "char")  # sentencepiece kinds; "phone" is PhoneUnits


class Units:
    """A trained unit inventory (sentencepiece model) with CTC class numbering."""

    def __init__(self, model: bytes) -> None:
        self.model = bytes(model)
        self.sp = spm.SentencePieceProcessor(model_proto=self.model)
        pieces = [self.sp.id_to_piece(i) for i in range(self.sp.get_piece_size())]
        self.pieces = ["<blank>"] + pieces
        self.word_start = np.array([False] + [p.startswith(WORD_START) for p in pieces])

    @classmethod
    def train(cls, texts: Iterable[str], kind: str = "bpe", vocab_size: int = 64) -> Units:
        """Train ``kind`` units on ``texts``; the BPE vocabulary stops growing when no merge is left."""
        if kind not in KINDS:
            raise ValueError(f"unknown unit kind {kind!r}; known: {', '.join(KINDS)}")
        lines = [t for t in texts if t.strip()]
        if not lines:
            raise ValueError("no non-empty transcripts to train units on")
        letters = {c for t in lines for c in t.replace(" ", "")}
        size = len(letters) + 2 if kind == "char" else max(vocab_size, len(letters) + 2)
        buffer = io.BytesIO()
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(lines), model_writer=buffer, model_type=kind, vocab_size=size,
            hard_vocab_limit=False, character_coverage=1.0, normalization_rule_name="identity",
            unk_id=0, bos_id=-1, eos_id=-1, pad_id=-1, split_digits=False,
            num_threads=1, minloglevel=2)
        return cls(buffer.getvalue())

    @property
    def num_classes(self) -> int:
        """Output size of a CTC network: the units plus the blank."""
        return len(self.pieces)

    def encode(self, text: str) -> np.ndarray:
        """Class ids (1-based) of a transcript."""
        return np.asarray(self.sp.encode(text), dtype=np.int64) + 1

    def decode(self, classes: Iterable[int]) -> str:
        """Text of a class sequence (blanks dropped; no CTC collapsing here)."""
        return self.sp.decode([int(c) - 1 for c in classes if c != 0])


class PhoneUnits:
    """CTC units over a lang's non-silence phones; words are spelled with the lexicon."""

    def __init__(self, phones: list[str], lexicon: dict[str, list[str]]) -> None:
        self.phones = list(phones)
        self.pieces = ["<blank>", *self.phones]
        self.lexicon = lexicon
        self._class = {p: k for k, p in enumerate(self.phones, start=1)}

    @classmethod
    def from_lang(cls, lang_dir: str | Path) -> PhoneUnits:
        """The units of lang folder ``lang_dir`` (``phones.txt``, ``nonsilence.int``, ``lexicon.txt``)."""
        lang = Path(lang_dir)
        names = {}
        for line in (lang / "phones.txt").read_text(encoding="utf-8").splitlines():
            if line.strip():
                name, index = line.split()
                names[int(index)] = name
        phones = [names[int(i)] for i in (lang / "nonsilence.int").read_text().split()]
        lexicon: dict[str, list[str]] = {}
        for line in (lang / "lexicon.txt").read_text(encoding="utf-8").splitlines():
            fields = line.split()
            if fields:
                lexicon.setdefault(fields[0], fields[1:])  # the first pronunciation
        return cls(phones, lexicon)

    @property
    def num_classes(self) -> int:
        """Output size of a CTC network: the phones plus the blank."""
        return len(self.pieces)

    @property
    def model(self) -> bytes:
        """The phone list, one per line (``units.txt``; the network header keeps it too)."""
        return "".join(f"{p}\n" for p in self.phones).encode()

    def encode(self, text: str) -> np.ndarray:
        """Class ids of a transcript; empty when a word has no pronunciation made of these phones."""
        classes = []
        for word in text.split():
            pron = self.lexicon.get(word)
            if not pron or any(p not in self._class for p in pron):
                return np.zeros(0, dtype=np.int64)
            classes += [self._class[p] for p in pron]
        return np.asarray(classes, dtype=np.int64)
