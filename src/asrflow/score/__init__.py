"""Scoring: WER/SER with S/D/I counts, per speaker and per utterance (kaldialign)."""

from asrflow.score.wer import ErrorCounts, align_words, score_corpus

__all__ = ["ErrorCounts", "align_words", "score_corpus"]
