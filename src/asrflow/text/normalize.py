"""One text normaliser for every recipe: what is scored is what the lexicon sees.

Rules, applied in order:

1. Unicode NFC, lowercase.
2. Remove ``[...]`` and ``(...)`` spans (non-speech notes such as ``[beep]``).
3. Hyphens (and dashes) become spaces.
4. Numerals become words (``num2words`` in the corpus language):

   * ordinals (``11th``; Spanish ``1º``/``1ª``; French ``1er``/``2e``/``2ème``) → ordinal words;
   * decimals (``2.5``) → cardinal, the language's word for the point, then digit by digit;
   * thousands groups (``1,000``) → cardinal;
   * one to three digits without a leading zero → cardinal;
   * longer numbers, or a leading zero (``007``, ``5551234``) → digit by digit.

5. ``%`` and ``&`` become words; other punctuation is dropped, except an apostrophe
   between two letters (``don't`` keeps it, ``'quoted'`` loses it).
6. Spaces collapse; the result may be empty (the caller rejects such an utterance).
"""

from __future__ import annotations

import functools
import re
import unicodedata

from num2words import num2words

#: Words spoken for symbols and the decimal point, per language.
_SYMBOL_WORDS: dict[str, dict[str, str]] = {
    "en": {"%": " percent ", "&": " and ", "point": "point"},
    "es": {"%": " por ciento ", "&": " y ", "point": "punto"},
    "fr": {"%": " pour cent ", "&": " et ", "point": "virgule"},
}

_BRACKETS = re.compile(r"\[[^\]]*\]|\([^)]*\)")
_DASHES = re.compile(r"[-\u2010-\u2015]")
_ORDINAL = {
    "en": re.compile(r"\b(\d+)(?:st|nd|rd|th)\b"),
    "es": re.compile(r"\b(\d+)(?:º|°|ª|\.º|\.ª|er|ro|do|to|vo|no|mo)(?!\w)"),
    "fr": re.compile(r"\b(\d+)(?:er|re|ère|e|ème|eme|nd|nde)\b"),
}
_DECIMAL = re.compile(r"\b(\d+)[.,](\d+)\b")
_THOUSANDS = re.compile(r"\b\d{1,3}(?:,\d{3})+\b")
_NUMBER = re.compile(r"\d+")
_APOSTROPHES = re.compile(r"[\u2018\u2019\u02bc`´]")
_SPACES = re.compile(r"\s+")


@functools.lru_cache(maxsize=4096)
def _words(n: int, lang: str, to: str = "cardinal") -> str:
    """Spell ``n`` in ``lang`` (num2words), with its hyphens and commas turned to spaces."""
    text = num2words(n, lang=lang, to=to)
    return _DASHES.sub(" ", text).replace(",", " ")


def _digits(digits: str, lang: str) -> str:
    return " ".join(_words(int(d), lang) for d in digits)


def _spell_number(digits: str, lang: str) -> str:
    """Cardinal for 1-3 digits without a leading zero, else digit by digit."""
    if len(digits) <= 3 and (digits == "0" or not digits.startswith("0")):
        return _words(int(digits), lang)
    return _digits(digits, lang)


def _numerals_to_words(text: str, lang: str) -> str:
    point = _SYMBOL_WORDS.get(lang, _SYMBOL_WORDS["en"])["point"]
    ordinal = _ORDINAL.get(lang, _ORDINAL["en"])
    text = ordinal.sub(lambda m: f" {_words(int(m.group(1)), lang, 'ordinal')} ", text)
    # French and Spanish write "1,5" for a decimal; English uses "," for thousands.
    if lang == "en":
        text = _THOUSANDS.sub(lambda m: f" {_words(int(m.group(0).replace(',', '')), lang)} ", text)
        decimal = re.compile(r"\b(\d+)\.(\d+)\b")
    else:
        decimal = _DECIMAL
    text = decimal.sub(
        lambda m: f" {_spell_number(m.group(1), lang)} {point} {_digits(m.group(2), lang)} ", text
    )
    return _NUMBER.sub(lambda m: f" {_spell_number(m.group(0), lang)} ", text)


def _keep_char(ch: str) -> bool:
    return ch.isalnum() or ch.isspace() or ch == "'"


def normalize_text(text: str, lang: str = "en") -> str:
    """Normalise a transcript for lexicons and scoring (see the module docstring).

    >>> normalize_text("Press 1, then the 11th [beep] key-pad 007!")
    'press one then the eleventh key pad zero zero seven'
    """
    text = unicodedata.normalize("NFC", text).lower()
    text = _BRACKETS.sub(" ", text)
    text = _APOSTROPHES.sub("'", text)
    text = _numerals_to_words(text, lang)
    text = _DASHES.sub(" ", text)
    for symbol, word in _SYMBOL_WORDS.get(lang, _SYMBOL_WORDS["en"]).items():
        if len(symbol) == 1:
            text = text.replace(symbol, word)
    text = "".join(ch if _keep_char(ch) else " " for ch in text)
    # An apostrophe survives only between two letters.
    text = re.sub(r"(?<![^\W\d_])'|'(?![^\W\d_])", " ", text)
    return _SPACES.sub(" ", text).strip()
