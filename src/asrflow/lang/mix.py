"""Several n-gram models made one: a vocabulary limit, linear interpolation and its weights.

A corpus of a few thousand transcripts gives an LM that knows few words and few word pairs;
a large text from elsewhere knows many words but not the corpus's sentences. The standard
remedy (SRILM's ``ngram -mix-lm``, Kaldi's recipes that mix an in-domain and a general model)
estimates one model per text and interpolates them:

    p(w | h) = Σ_i λ_i · p_i(w | h)

:func:`mix_arpa` writes that mixture as one backoff model (static interpolation): every n-gram
listed by any component gets the interpolated probability, and each history's backoff weight is
then recomputed so that its distribution sums to one, so words no component lists after ``h``
take ``bow(h) · p(w | h')`` as in any backoff model. A word one component lacks has probability
zero in that component. :func:`mix_weights` chooses the λ_i that maximise the likelihood of
held-out text by expectation-maximisation (SRILM's ``compute-best-mix``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from asrflow.lang.arpa import BOS, EOS, Arpa, LmError, _renormalise

#: log10 probability ARPA files give the unpredicted ``<s>``.
NEVER = -99.0


def limit_vocabulary(model: Arpa, vocabulary: set[str]) -> Arpa:
    """``model`` without the n-grams that contain a word outside ``vocabulary`` (the sentence markers are
    kept): the remaining unigrams rescaled to sum to one and every backoff weight recomputed."""
    keep = vocabulary | {BOS, EOS}
    out = Arpa({g: p for g, p in model.prob.items() if all(w in keep for w in g)},
               {g: b for g, b in model.backoff.items() if all(w in keep for w in g)})
    if not out.words:
        raise LmError("no word of the LM is in the vocabulary")
    mass = sum(10 ** p for g, p in out.prob.items() if len(g) == 1 and g[0] != BOS)
    shift = -math.log10(mass)
    for gram in [g for g in out.prob if len(g) == 1 and g[0] != BOS]:
        out.prob[gram] += shift
    _renormalise(out)
    return out


def _component_prob(model: Arpa, vocabulary: set[str], word: str, history: tuple[str, ...]) -> float:
    """p(word | history) in one component; zero for a word it lacks."""
    if word != EOS and word not in vocabulary:
        return 0.0
    return 10 ** model.log10p(word, history)


def mix_arpa(models: list[Arpa], weights: list[float]) -> Arpa:
    """The static linear interpolation of ``models`` with ``weights`` (which sum to one): the union of their
    n-grams, each with ``log10 Σ λ_i p_i(w | h)``, and backoff weights recomputed."""
    if len(models) != len(weights) or not models:
        raise ValueError("one weight per model is needed")
    if abs(sum(weights) - 1.0) > 1e-6 or min(weights) < 0:
        raise LmError(f"LM interpolation weights must be non-negative and sum to one, not {weights}")
    vocabularies = [m.words for m in models]
    out = Arpa()
    for gram in set().union(*(m.prob for m in models)):
        if gram == (BOS,):
            out.prob[gram] = NEVER
            continue
        history, word = gram[:-1], gram[-1]
        p = sum(lam * _component_prob(m, v, word, history)
                for lam, m, v in zip(weights, models, vocabularies) if lam > 0)
        if p > 0:
            out.prob[gram] = math.log10(p)
    out.refresh()
    for gram in out.prob:
        if len(gram) < out.order and gram[-1] != EOS:
            out.backoff[gram] = 0.0
    _renormalise(out)
    return out


def token_probs(models: list[Arpa], sentences: Iterable[list[str]]) -> list[list[float]]:
    """Each component's probability of every predicted token of ``sentences`` (``</s>`` included; a word
    no component knows is skipped and resets the history, as in perplexity)."""
    vocabularies = [m.words for m in models]
    known = set().union(*vocabularies)
    order = max(m.order for m in models)
    rows = []
    for sent in sentences:
        history: tuple[str, ...] = (BOS,)
        for w in [*sent, EOS]:
            if w != EOS and w not in known:
                history = ()
                continue
            rows.append([_component_prob(m, v, w, history) for m, v in zip(models, vocabularies)])
            history = (history + (w,))[-(order - 1):] if order > 1 else ()
    return rows


def mix_weights(models: list[Arpa], sentences: list[list[str]], iterations: int = 100,
                tolerance: float = 1e-5) -> tuple[list[float], float]:
    """The interpolation weights that maximise the likelihood of held-out ``sentences`` (EM from equal
    weights), and the mixture's perplexity on them."""
    rows = token_probs(models, sentences)
    if not rows:
        raise LmError("no held-out words to choose the LM interpolation weights on")
    k = len(models)
    weights = [1.0 / k] * k
    for _ in range(iterations):
        posterior = [0.0] * k
        for probs in rows:
            total = sum(lam * p for lam, p in zip(weights, probs))
            for i in range(k):
                posterior[i] += weights[i] * probs[i] / total
        new = [p / len(rows) for p in posterior]
        done = max(abs(a - b) for a, b in zip(new, weights)) < tolerance
        weights = new
        if done:
            break
    return weights, mixture_perplexity(rows, weights)


def mixture_perplexity(rows: list[list[float]], weights: list[float]) -> float:
    """Per-token perplexity of the interpolated model over :func:`token_probs` rows."""
    logprob = sum(math.log(sum(lam * p for lam, p in zip(weights, probs))) for probs in rows)
    return math.exp(-logprob / len(rows))
