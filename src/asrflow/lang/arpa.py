"""Backoff n-gram models in ARPA form, read, written and pruned to a size.

Pruning keeps at most ``max_ngrams`` n-grams above the unigrams. Each candidate n-gram
``(h, w)`` (one that no longer kept n-gram extends) is scored by how much the model's
log-likelihood of the text it stands for would drop if ``p(w | h)`` were replaced by its
backoff estimate (Seymore and Rosenfeld's weighted-difference criterion, the basis of
SRILM's and KenLM's pruning):

    score(h, w) = p(h, w) · [log p(w | h) − log(bow(h) · p(w | h'))]

with ``p(h, w)`` the model's own joint probability. The n-grams of every order are ranked
together and the highest-scoring kept, each with its history (:func:`prune_arpa`); then every
history's backoff weight is recomputed so that its distribution sums to one again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

BOS, EOS = "<s>", "</s>"


class ArpaError(ValueError):
    """A file that is not a readable ARPA model."""


class LmError(ValueError):
    """An LM input (lang.lm_text, lang.lm_arpa) that cannot be used."""


@dataclass
class Arpa:
    """log10 probabilities and backoff weights of every listed n-gram (tuples of words)."""

    prob: dict[tuple[str, ...], float] = field(default_factory=dict)
    backoff: dict[tuple[str, ...], float] = field(default_factory=dict)
    order: int = 0  # the longest n-gram's length (:meth:`refresh` after changing ``prob``)

    def __post_init__(self) -> None:
        self.refresh()

    def refresh(self) -> None:
        """Recompute :attr:`order` from the listed n-grams."""
        self.order = max((len(g) for g in self.prob), default=0)

    @property
    def words(self) -> set[str]:
        """The vocabulary: every unigram but the sentence markers."""
        return {g[0] for g in self.prob if len(g) == 1} - {BOS, EOS}

    def counts(self) -> list[int]:
        """Number of n-grams of each order, from 1."""
        out = [0] * self.order
        for g in self.prob:
            out[len(g) - 1] += 1
        return out

    def log10p(self, word: str, history: tuple[str, ...]) -> float:
        """log10 p(word | history) by the backoff rule (the word must be in the vocabulary or ``</s>``)."""
        history = history[-(self.order - 1):] if self.order > 1 else ()
        cost = 0.0
        while (history + (word,)) not in self.prob:
            if not history:
                raise KeyError(word)
            cost += self.backoff.get(history, 0.0)
            history = history[1:]
        return cost + self.prob[history + (word,)]

    def perplexity(self, sentences: list[list[str]]) -> float:
        """Per-word perplexity with ``</s>`` counted; out-of-vocabulary words skipped, their history reset
        (as SRILM does)."""
        total, n = 0.0, 0
        vocab = self.words
        for sent in sentences:
            history: tuple[str, ...] = (BOS,)
            for w in [*sent, EOS]:
                if w != EOS and w not in vocab:
                    history = ()
                    continue
                total += self.log10p(w, history)
                history = (history + (w,))[-(self.order - 1):] if self.order > 1 else ()
                n += 1
        return 10 ** (-total / n) if n else float("inf")


def read_arpa(path: str | Path) -> Arpa:
    """Read an ARPA file; a clear :class:`ArpaError` naming the file and line on anything malformed."""
    model, order = Arpa(), 0
    path = Path(path)
    if not path.is_file():
        raise ArpaError(f"{path}: no such ARPA file")
    with open(path, encoding="utf-8") as f:
        for number, raw in enumerate(f, 1):
            line = raw.strip()
            if not line or line == "\\data\\" or line.startswith("ngram ") or line == "\\end\\":
                continue
            if line.startswith("\\") and line.endswith("-grams:"):
                order = int(line[1:].split("-")[0])
                continue
            fields = line.split()
            if order == 0 or len(fields) not in (order + 1, order + 2):
                raise ArpaError(f"{path}:{number}: not an ARPA {order}-gram line: {raw.rstrip()!r}")
            try:
                gram = tuple(fields[1: order + 1])
                model.prob[gram] = float(fields[0])
                if len(fields) == order + 2:
                    model.backoff[gram] = float(fields[order + 1])
            except ValueError:
                raise ArpaError(f"{path}:{number}: not a number in {raw.rstrip()!r}") from None
    if not model.prob:
        raise ArpaError(f"{path}: no n-grams")
    model.refresh()
    return model


def arpa_words(path: str | Path) -> set[str]:
    """The words of an ARPA file's unigram section but the sentence markers (:attr:`Arpa.words`), read without
    the higher orders (which it stops before)."""
    path = Path(path)
    if not path.is_file():
        raise ArpaError(f"{path}: no such ARPA file")
    words: set[str] = set()
    with open(path, encoding="utf-8") as f:
        in_unigrams = False
        for number, raw in enumerate(f, 1):
            line = raw.strip()
            if line.startswith("\\"):  # the next section, or the end marker
                if in_unigrams:
                    break
                in_unigrams = line == "\\1-grams:"
            elif in_unigrams and line:
                fields = line.split()
                if len(fields) not in (2, 3):
                    raise ArpaError(f"{path}:{number}: not an ARPA 1-gram line: {raw.rstrip()!r}")
                words.add(fields[1])
    if not words:
        raise ArpaError(f"{path}: no 1-grams")
    return words - {BOS, EOS}


def write_arpa(model: Arpa, path: str | Path) -> None:
    """Write ``model`` in ARPA form (n-grams of each order sorted; the highest order without backoff weights)."""
    lines = ["\\data\\"] + [f"ngram {k + 1}={n}" for k, n in enumerate(model.counts())] + [""]
    order = model.order
    for k in range(1, order + 1):
        lines.append(f"\\{k}-grams:")
        for gram in sorted(g for g in model.prob if len(g) == k):
            fields = [f"{model.prob[gram]:.6f}", " ".join(gram)]
            if gram in model.backoff and k < order:
                fields.append(f"{model.backoff[gram]:.6f}")
            lines.append("\t".join(fields))
        lines.append("")
    lines.append("\\end\\")
    Path(path).write_text("\n".join(lines) + "\n", encoding="utf-8")


def _history_log10p(model: Arpa, history: tuple[str, ...], cache: dict) -> float:
    """log10 p(history) by the chain rule from ``<s>`` (a history starting with ``<s>`` is given that)."""
    if history in cache:
        return cache[history]
    if not history or history == (BOS,):
        value = 0.0
    else:
        value = _history_log10p(model, history[:-1], cache) + model.log10p(history[-1], history[:-1])
    cache[history] = value
    return value


def prune_arpa(model: Arpa, max_ngrams: int) -> Arpa:
    """A copy of ``model`` with at most ``max_ngrams`` n-grams of order 2 and above and its backoff weights
    renormalised.

    Every n-gram is scored once against ``model`` (the weighted difference above), all orders
    together; the n-grams are kept from the highest score down, each with the shorter n-grams
    that are its history (an n-gram needs its history listed for the backoff weight), while they
    fit. So a trigram that matters more than a bigram outlives it, and a small budget keeps the
    model's most useful trigrams instead of dropping the whole highest order first."""
    above = [g for g in model.prob if len(g) > 1]
    kept = set(above) if len(above) <= max_ngrams else _most_important(model, above, max_ngrams)
    out = Arpa({g: p for g, p in model.prob.items() if len(g) == 1 or g in kept},
               {g: b for g, b in model.backoff.items() if len(g) == 1 or g in kept})
    _renormalise(out)
    return out


def _most_important(model: Arpa, grams: list[tuple[str, ...]], max_ngrams: int) -> set[tuple[str, ...]]:
    """At most ``max_ngrams`` of ``grams``, from the highest weighted-difference score down, each with the
    shorter n-grams (of order 2 and above) that are its history."""
    cache: dict = {}
    scores = []
    for gram in grams:
        history, word = gram[:-1], gram[-1]
        lower = model.backoff.get(history, 0.0) + model.log10p(word, history[1:])
        joint = 10 ** (_history_log10p(model, history, cache) + model.prob[gram])
        scores.append((joint * (model.prob[gram] - lower) * math.log(10), gram))
    scores.sort(key=lambda item: (-item[0], item[1]))
    kept: set[tuple[str, ...]] = set()
    for _, gram in scores:
        if gram in kept:
            continue
        new = [gram[:k] for k in range(2, len(gram) + 1) if gram[:k] not in kept]
        if len(kept) + len(new) <= max_ngrams:
            kept.update(new)
        if len(kept) == max_ngrams:
            break
    return kept


def _renormalise(model: Arpa) -> None:
    """Recompute every history's backoff weight so that p(· | h) sums to one:
    ``bow(h) = (1 − Σ p(w | h)) / (1 − Σ p(w | h'))`` over the words listed after ``h``."""
    listed: dict[tuple[str, ...], list[str]] = {}
    for gram in model.prob:
        if len(gram) > 1:
            listed.setdefault(gram[:-1], []).append(gram[-1])
    for history in [g for g in model.backoff if len(g) < model.order]:
        words = listed.get(history)
        if not words:
            model.backoff[history] = 0.0
            continue
        high = sum(10 ** model.prob[history + (w,)] for w in words)
        low = sum(10 ** model.log10p(w, history[1:]) for w in words)
        if high >= 1.0 or low >= 1.0:
            continue  # nothing left to back off to: keep the weight
        model.backoff[history] = math.log10((1.0 - high) / (1.0 - low))
