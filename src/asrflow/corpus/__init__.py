"""Corpus recipes: list a corpus's utterances and define its splits.

Each recipe finds its corpus (``corpus.path``, else ``$ASRFLOW_DATA_MIRROR``, else a
download from the canonical source) and hands :class:`RawUtterance` records to the data
stage, which validates and normalises them the same way for every corpus.
"""

from __future__ import annotations

from asrflow.corpus.asterisk import Asterisk
from asrflow.corpus.base import MIRROR_ENV, CorpusError, Listing, RawUtterance, Recipe
from asrflow.corpus.fsdd import FSDD
from asrflow.corpus.kaldi_dir import KaldiDir
from asrflow.corpus.speechocean762 import SpeechOcean762
from asrflow.corpus.tsv import TsvFolder
from asrflow.corpus.yesno import YesNo

RECIPES = {"yesno": YesNo, "fsdd": FSDD, "asterisk": Asterisk, "kaldi_dir": KaldiDir, "tsv": TsvFolder,
           "speechocean762": SpeechOcean762}


def recipe_from_config(corpus: dict) -> Recipe:
    """Build the recipe named by ``corpus.name`` from the resolved ``corpus`` config section."""
    try:
        cls = RECIPES[corpus["name"]]
    except KeyError:
        raise CorpusError(f"unknown corpus recipe {corpus['name']!r}; known: {', '.join(RECIPES)}") from None
    return cls.from_config(corpus)


__all__ = ["MIRROR_ENV", "RECIPES", "CorpusError", "Listing", "RawUtterance", "Recipe", "recipe_from_config"]
