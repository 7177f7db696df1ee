"""CTC decoding: prefix beam search over units with a word n-gram LM (shallow fusion), or,
for networks over phones, Kaldi's decoder through a TLG graph (:func:`decode_shard_graph_settings`).

Prefixes are unit sequences with separate blank / non-blank ending scores (Hannun et al.,
2014). A unit that starts a word ("▁") closes the word before it, which then adds
``lm_weight · ln p(word | history) + word_bonus`` to the prefix's score; the last word and
``</s>`` are scored at the end. Only a frame's ``max_units`` most probable units above
``prune`` (log probability) are tried, and a frame where blank is nearly certain only
extends by blank. With ``vocabulary: closed`` the search writes only the LM's words: a prefix
whose open word starts no word of the vocabulary, or that closes a word outside it, is
dropped (a lexicon-constrained search; the open default can write any spelling, which
suits corpora with many OOV words).
"""

from __future__ import annotations

import math
import time
import weakref
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from asrflow.config.settings import Decoding
from asrflow.decode.decoder import DecodeOptions, DecodeResult, decode_settings
from asrflow.gmm.estep import Shard
from asrflow.lang.lm import BOS, EOS, UNK, ArpaLM
from asrflow.nnet.inference import Scoring
from asrflow.nnet.units import Units

NEG_INF = float("-inf")


@dataclass
class SearchOptions:
    beam: int = 8
    lm_weight: float = 0.5
    word_bonus: float = 1.0
    prune: float = -8.0  # ln p below which a unit is not tried at a frame
    max_units: int = 8  # at most this many of a frame's most probable units are tried
    blank_skip: float = -0.01  # ln p(blank) above which (p > 99 %) only the blank extension is kept
    vocabulary: str = "open"  # closed: only the LM's words


def search_options(nnet_decode: Decoding) -> SearchOptions:
    """The prefix beam search settings of ``nnet.decode``."""
    return SearchOptions(beam=nnet_decode.beam, lm_weight=nnet_decode.lm_weight, word_bonus=nnet_decode.word_bonus,
                         prune=nnet_decode.prune, vocabulary=nnet_decode.vocabulary)


@dataclass(frozen=True)
class Vocabulary:
    """The words a closed-vocabulary search may write, and every non-empty prefix of them."""

    words: frozenset[str]
    prefixes: frozenset[str]

    @classmethod
    def of(cls, words: Iterable[str]) -> Vocabulary:
        """From a word list (an LM's vocabulary: ``<s>``, ``</s>`` and ``<unk>`` are left out)."""
        kept = frozenset(w for w in words if w not in (BOS, EOS, UNK))
        return cls(kept, frozenset(w[:i] for w in kept for i in range(1, len(w) + 1)))

    def allows(self, before: _Words, after: _Words) -> bool:
        """Whether extending ``before`` to ``after`` keeps every word inside the vocabulary."""
        closed = len(after.history) > len(before.history) and after.history[-1] not in self.words
        return not closed and (not after.partial or after.partial in self.prefixes)


def vocabulary_for(opts: SearchOptions, lm: ArpaLM | None) -> Vocabulary | None:
    """The LM's :class:`Vocabulary` when ``opts`` asks for a closed vocabulary, else None."""
    if opts.vocabulary != "closed":
        return None
    if lm is None:
        raise ValueError("a closed-vocabulary CTC search needs the LM (its words are the vocabulary)")
    if lm not in _VOCABULARIES:
        _VOCABULARIES[lm] = Vocabulary.of(lm.vocab)
    return _VOCABULARIES[lm]


_VOCABULARIES: weakref.WeakKeyDictionary[ArpaLM, Vocabulary] = weakref.WeakKeyDictionary()


def graph_options(nnet_decode: Decoding, graph_decode: dict) -> DecodeOptions:
    """Decoder settings of a CTC network through TLG: ``tlg_acoustic_scale``, ``tlg_insertion_penalty``, beam
    and active states as hybrids."""
    return DecodeOptions(beam=nnet_decode.graph_beam or graph_decode["beam"],
                         max_active=nnet_decode.max_active or graph_decode["max_active"],
                         acoustic_scale=nnet_decode.tlg_acoustic_scale,
                         insertion_penalty=nnet_decode.tlg_insertion_penalty)


def decode_shard_graph_settings(shard: Shard, scoring: Scoring, graph_path: str,
                                settings: list[DecodeOptions]) -> list[DecodeResult]:
    """Words of each utterance of a shard with a CTC network through TLG, once per setting (on a Dask worker).

    The scaled log posteriors are the decodable (index ``k + 1`` = class ``k``, blank first),
    as TLG's input labels are numbered. One forward pass serves every setting
    (:func:`asrflow.decode.decoder.decode_settings`).
    """
    scoring.load()
    start = time.perf_counter()
    frames, posteriors = scoring.shard_log_posteriors(shard)
    return decode_settings(shard.utts, frames, posteriors, time.perf_counter() - start,
                           graph_path, settings, scaled_posteriors)


def scaled_posteriors(log_post: np.ndarray, opts: DecodeOptions) -> np.ndarray:
    """A CTC network's decodable matrix for TLG: its log posteriors times the acoustic scale."""
    return np.ascontiguousarray(opts.acoustic_scale * log_post, dtype=np.float32)


@dataclass
class _Words:
    """LM view of a prefix: score of its closed words, their history, the open word's text."""

    score: float
    history: tuple
    partial: str


def _lse(a: float, b: float) -> float:
    if a == NEG_INF:
        return b
    if b == NEG_INF:
        return a
    return max(a, b) + math.log1p(math.exp(-abs(a - b)))


def _close(words: _Words, lm: ArpaLM | None, opts: SearchOptions) -> tuple[float, tuple]:
    """Score of closing the open word (nothing when there is none)."""
    if not words.partial:
        return words.score, words.history
    lm_score = lm.logprob(words.partial, words.history) if lm is not None else 0.0
    history = words.history + (words.partial,)
    return words.score + opts.lm_weight * lm_score + opts.word_bonus, history


def _extend(words: _Words, piece: str, starts_word: bool, lm: ArpaLM | None, opts: SearchOptions) -> _Words:
    text = piece.lstrip("\u2581")
    if starts_word or not words.partial:
        score, history = _close(words, lm, opts)
        return _Words(score, history, text)
    return _Words(words.score, words.history, words.partial + text)


def _candidates(frame: np.ndarray, opts: SearchOptions) -> list[int]:
    """Non-blank units worth extending by at a frame: the ``max_units`` most probable above ``prune``."""
    k = min(opts.max_units + 1, frame.shape[0])
    top = np.argpartition(-frame, k - 1)[:k]
    return [int(c) for c in top if c and frame[c] > opts.prune]


def prefix_beam_search(log_probs: np.ndarray, pieces: list[str], word_start: np.ndarray, lm: ArpaLM | None,
                       opts: SearchOptions, vocabulary: Vocabulary | None = None) -> list[str]:
    """Best word sequence for one utterance's CTC log posteriors ``(frames, classes)``; class 0 = blank.

    With a ``vocabulary`` every word written is one of its words (an unfinished last word is
    dropped if no prefix in the beam ends on a whole word).
    """
    beams: dict[tuple, tuple[float, float]] = {(): (0.0, NEG_INF)}  # prefix -> (ln p blank-end, non-blank-end)
    words: dict[tuple, _Words] = {(): _Words(0.0, (BOS,), "")}
    for frame in log_probs:
        blank = float(frame[0])
        candidates = [] if blank > opts.blank_skip else _candidates(frame, opts)
        nxt: dict[tuple, list[float]] = {}

        def add(prefix: tuple, blank_end: float, non_blank_end: float,
                nxt: dict[tuple, list[float]] = nxt) -> None:
            slot = nxt.setdefault(prefix, [NEG_INF, NEG_INF])
            slot[0], slot[1] = _lse(slot[0], blank_end), _lse(slot[1], non_blank_end)

        for prefix, (pb, pnb) in beams.items():
            total = _lse(pb, pnb)
            add(prefix, total + blank, NEG_INF)
            last = prefix[-1] if prefix else None
            for c in candidates:
                p = float(frame[c])
                new = prefix + (c,)
                if new not in words:
                    extended = _extend(words[prefix], pieces[c], bool(word_start[c]), lm, opts)
                    words[new] = extended if vocabulary is None or vocabulary.allows(words[prefix], extended) else None
                if c == last:
                    add(prefix, NEG_INF, pnb + p)  # a repeat without blank collapses
                if words[new] is None:  # out of the vocabulary
                    continue
                add(new, NEG_INF, pb + p if c == last else total + p)  # after a blank, a repeat is a new unit
        ranked = sorted(nxt.items(), key=lambda kv: _lse(*kv[1]) + words[kv[0]].score, reverse=True)
        beams = {prefix: (scores[0], scores[1]) for prefix, scores in ranked[: opts.beam]}

    def final(prefix: tuple) -> float:
        if vocabulary is not None and words[prefix].partial and words[prefix].partial not in vocabulary.words:
            return NEG_INF
        score, history = _close(words[prefix], lm, opts)
        end = opts.lm_weight * lm.logprob(EOS, history) if lm is not None else 0.0
        return _lse(*beams[prefix]) + score + end

    best = max(beams, key=final)
    w = words[best]
    finished = vocabulary is None or final(best) > NEG_INF
    return [x for x in w.history if x != BOS] + ([w.partial] if w.partial and finished else [])


def decode_shard_settings(shard: Shard, scoring: Scoring, lm_path: str | None,
                          settings: list[SearchOptions]) -> list[DecodeResult]:
    """Words of each utterance of a shard with a CTC network, once per search setting (runs on a Dask worker).

    One forward pass (padded batches) serves every setting; each result's time covers it and
    that setting's search.
    """
    _, header = scoring.load()
    units = Units(header["units"].numpy().tobytes())
    lm = _lm(lm_path)
    start = time.perf_counter()
    lengths, posteriors = scoring.shard_log_posteriors(shard)
    forward = time.perf_counter() - start
    frames = sum(lengths)
    results = []
    for opts in settings:
        begin = time.perf_counter()
        use, vocabulary = lm if opts.lm_weight > 0 else None, vocabulary_for(opts, lm)
        hyps = {utt: prefix_beam_search(p, units.pieces, units.word_start, use, opts, vocabulary)
                for utt, p in zip(shard.utts, posteriors)}
        results.append(DecodeResult(hyps, [], frames, forward + time.perf_counter() - begin))
    return results


_LMS: dict[str, ArpaLM] = {}


def _lm(path: str | None) -> ArpaLM | None:
    if path is None:
        return None
    if path not in _LMS:
        _LMS[path] = ArpaLM(path)
    return _LMS[path]
