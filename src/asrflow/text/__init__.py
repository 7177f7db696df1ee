"""Text normalisation shared by every corpus recipe, lexicon and scorer."""

from asrflow.text.normalize import normalize_text

__all__ = ["normalize_text"]
