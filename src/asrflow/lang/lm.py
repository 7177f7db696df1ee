"""N-gram language models: interpolated Kneser-Ney estimated from transcripts, written as ARPA.

For order n the highest-order estimate is

    p(w | h) = max(c(h w) - D, 0) / c(h) + γ(h) · p_lower(w | h'),   γ(h) = D · N1+(h •) / c(h)

and lower orders use continuation counts N1+(• h' w) (plain counts for n-grams that start
with ``<s>``, which have no left context). Each order has its own discount
D = n1 / (n1 + 2 n2) from its count-of-counts, clamped to [0.1, 0.9] when the estimate is
undefined or extreme (tiny corpora such as yesno). The unigram level interpolates with a
uniform distribution over the vocabulary, so every word of it has a probability.

Written in backoff form, the weight of a history is exactly γ(h) ≤ 1, so the model can
never have a positive log backoff weight (a fault seen with kaldingram on a two-word
corpus).
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path

from asrflow.lang.arpa import Arpa, write_arpa

BOS, EOS, UNK = "<s>", "</s>", "<unk>"


def _discount(counts: Counter) -> float:
    n1 = sum(1 for c in counts.values() if c == 1)
    n2 = sum(1 for c in counts.values() if c == 2)
    if n1 == 0 or n2 == 0:
        return 0.5
    return min(0.9, max(0.1, n1 / (n1 + 2 * n2)))


class KneserNeyLM:
    """An interpolated Kneser-Ney n-gram model over a fixed vocabulary."""

    def __init__(self, sentences: Iterable[list[str]], order: int = 3, vocabulary: Iterable[str] = ()) -> None:
        if order < 1:
            raise ValueError("LM order must be at least 1")
        self.order = order
        sentences = [list(s) for s in sentences]
        self.vocab = sorted((set(vocabulary) | {w for s in sentences for w in s} | {EOS}) - {BOS})
        counts: list[Counter] = [Counter() for _ in range(order + 1)]  # counts[k]: k-gram tuples
        for sent in sentences:
            padded = [BOS] + sent + [EOS]
            for k in range(1, order + 1):
                for i in range(1 if k == 1 else k - 1, len(padded)):  # "<s>" alone is never predicted
                    counts[k][tuple(padded[i - k + 1 : i + 1])] += 1
        # Modified counts: highest order raw; lower orders continuation counts, except <s>-initial.
        self.counts: list[Counter] = [Counter() for _ in range(order + 1)]
        self.counts[order] = counts[order]
        for k in range(order - 1, 0, -1):
            left_contexts: dict[tuple, set] = defaultdict(set)
            for gram in counts[k + 1]:
                left_contexts[gram[1:]].add(gram[0])
            mod = Counter()
            for gram, raw in counts[k].items():
                mod[gram] = raw if gram[0] == BOS else len(left_contexts.get(gram, ())) or raw
            self.counts[k] = mod
        self.discount = [0.0] + [_discount(self.counts[k]) for k in range(1, order + 1)]
        self._context_total: list[dict[tuple, int]] = [dict() for _ in range(order + 1)]
        self._context_types: list[dict[tuple, int]] = [dict() for _ in range(order + 1)]
        for k in range(1, order + 1):
            total: dict[tuple, int] = defaultdict(int)
            types: dict[tuple, int] = defaultdict(int)
            for gram, c in self.counts[k].items():
                total[gram[:-1]] += c
                types[gram[:-1]] += 1
            self._context_total[k], self._context_types[k] = dict(total), dict(types)
        self._cache: dict[tuple, float] = {}

    def gamma(self, history: tuple) -> float:
        """Interpolation (= backoff) weight of ``history`` at its order."""
        k = len(history) + 1
        total = self._context_total[k].get(history)
        if not total:
            return 1.0
        return self.discount[k] * self._context_types[k][history] / total

    def prob(self, word: str, history: tuple = ()) -> float:
        """p(word | history), history truncated to order - 1 words."""
        history = tuple(history)[-(self.order - 1):] if self.order > 1 else ()
        key = (word, history)
        if key in self._cache:
            return self._cache[key]
        k = len(history) + 1
        if k == 1:
            total = self._context_total[1].get((), 0)
            uniform = 1.0 / len(self.vocab)
            if not total:
                value = uniform
            else:
                c = self.counts[1].get((word,), 0)
                value = max(c - self.discount[1], 0.0) / total + self.gamma(()) * uniform
        else:
            lower = self.prob(word, history[1:])
            total = self._context_total[k].get(history)
            if not total:
                value = lower
            else:
                c = self.counts[k].get(history + (word,), 0)
                value = max(c - self.discount[k], 0.0) / total + self.gamma(history) * lower
        self._cache[key] = value
        return value

    def arpa(self) -> Arpa:
        """The model as an :class:`~asrflow.lang.arpa.Arpa` (log10 probabilities and backoff weights)."""
        model = Arpa()
        grams: list[list[tuple]] = [[] for _ in range(self.order + 1)]
        grams[1] = [(w,) for w in self.vocab] + [(BOS,)]
        for k in range(2, self.order + 1):
            grams[k] = list(self.counts[k])
        for k in range(1, self.order + 1):
            for gram in grams[k]:
                history, word = gram[:-1], gram[-1]
                model.prob[gram] = -99.0 if word == BOS else math.log10(self.prob(word, history))
                if k < self.order and word != EOS:
                    bow = self.gamma(gram) if self._context_total[k + 1].get(gram) else 1.0
                    model.backoff[gram] = math.log10(bow)
        model.refresh()
        return model

    def write_arpa(self, path: str | Path) -> None:
        """Write the model in ARPA format (log10 probabilities and backoff weights)."""
        write_arpa(self.arpa(), path)

    def perplexity(self, sentences: Iterable[list[str]]) -> float:
        """Per-word perplexity (``</s>`` counted; out-of-vocabulary words skipped, as SRILM does)."""
        logprob, n = 0.0, 0
        vocab = set(self.vocab)
        for sent in sentences:
            history: tuple = (BOS,)
            for w in sent + [EOS]:
                if w not in vocab:
                    history = ()
                    continue
                logprob += math.log(self.prob(w, history))
                history = (history + (w,))[-(self.order - 1):] if self.order > 1 else ()
                n += 1
        return math.exp(-logprob / n) if n else float("inf")


class ArpaLM:
    """A backoff n-gram model read from an ARPA file, scored in natural log (for CTC search).

    ``logprob`` follows the ARPA backoff rule: the longest listed n-gram, else the history's
    backoff weight plus the shorter history's estimate. Words the model lacks score
    ``<unk>`` when it is listed, else ``oov_logprob``.
    """

    def __init__(self, path: str | Path, oov_logprob: float = -10.0) -> None:
        self.prob: dict[tuple, float] = {}
        self.backoff: dict[tuple, float] = {}
        ln10 = math.log(10.0)
        order = 0
        for raw in Path(path).read_text(encoding="utf-8").splitlines():
            line = raw.strip()
            if not line or line.startswith("\\data\\") or line.startswith("ngram ") or line == "\\end\\":
                continue
            if line.startswith("\\") and line.endswith("-grams:"):
                order = int(line[1:].split("-")[0])
                continue
            fields = line.split()
            if len(fields) < order + 1:
                raise ValueError(f"{path}: malformed {order}-gram line {raw!r}")
            gram = tuple(fields[1 : order + 1])
            self.prob[gram] = float(fields[0]) * ln10
            if len(fields) > order + 1:
                self.backoff[gram] = float(fields[order + 1]) * ln10
        self.order = max((len(g) for g in self.prob), default=1)
        self.vocab = {g[0] for g in self.prob if len(g) == 1}
        self.oov_logprob = oov_logprob
        self._cache: dict[tuple, float] = {}

    def logprob(self, word: str, history: tuple = ()) -> float:
        """ln p(word | history)."""
        if word not in self.vocab:
            return self.prob[(UNK,)] if UNK in self.vocab else self.oov_logprob
        history = tuple(history)[-(self.order - 1):] if self.order > 1 else ()
        key = history + (word,)
        if key in self._cache:
            return self._cache[key]
        if key in self.prob:
            value = self.prob[key]
        elif not history:
            value = self.oov_logprob
        else:
            value = self.backoff.get(history, 0.0) + self.logprob(word, history[1:])
        self._cache[key] = value
        return value
