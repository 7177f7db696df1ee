"""The lang stage: lexicon, phone/word tables, topology, L, LM (ARPA) and G for one training split.

The lexicon covers every training transcript, ``corpus.extra_training`` ones included, and every
word of the LM; the LM (and so the decoder's vocabulary) is estimated from the experiment's own
corpus's transcripts and ``lang.lm_text`` (pooled, or interpolated with ``lang.lm_combine:
interpolate``), or read from ``lang.lm_arpa``, and pruned to ``lang.lm_max_ngrams``.

Output folder (``results/<exp>/lang/<train split>/``), Kaldi's lang-dir layout::

    lexicon.txt  phones.txt  words.txt  topo  disambig.int  silence.int  nonsilence.int
    L.fst  L_disambig.fst  lm.arpa  G.fst  manifest.json (sizes, OOV rate per test set, perplexity)
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from asrflow.data.datadir import own_texts, read_table
from asrflow.lang.arpa import Arpa, LmError, prune_arpa, read_arpa, write_arpa
from asrflow.lang.graph import compile_grammar, compile_text_fst
from asrflow.lang.lexicon import (
    OOV_WORD,
    SIL,
    SIL_WORD,
    build_lexicon,
    cmudict_pronunciations,
    oov_rate,
    phone_inventory,
    read_lexicon,
)
from asrflow.lang.lm import KneserNeyLM
from asrflow.lang.mix import limit_vocabulary, mix_arpa, mix_weights
from asrflow.lang.symbols import add_disambig, lexicon_fst_text, phone_table, topology_text, word_table, write_table
from asrflow.text.normalize import normalize_text
from asrflow.text.sources import TextSourceError, is_named, named_sentences

#: Every this-many-th training transcript is held out to choose LM interpolation weights on.
HELD_OUT_EVERY = 10


def write_grammar(texts: list[str], vocabulary: list[str], order: int, out: Path) -> KneserNeyLM:
    """Estimate the n-gram LM of ``texts`` over ``vocabulary``; write ``lm.arpa`` and ``G.fst`` (over
    ``out/words.txt``) into ``out``."""
    lm = KneserNeyLM([t.split() for t in texts], order, vocabulary=vocabulary)
    lm.write_arpa(out / "lm.arpa")
    compile_grammar(out / "lm.arpa", out / "words.txt").write(str(out / "G.fst"))
    return lm


def text_sentences(entry: str, language: str, download_dir: str | Path) -> list[str]:
    """The sentences of one ``lang.lm_text`` entry, normalised as transcripts are, empty lines dropped: a
    file (one sentence a line) or a named corpus (:mod:`asrflow.text.sources`, ``nltk:brown``)."""
    if is_named(entry):
        try:
            lines = named_sentences(entry, download_dir)
        except TextSourceError as exc:
            raise LmError(str(exc)) from None
    else:
        try:
            lines = Path(entry).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise LmError(f"lang.lm_text: cannot read {entry}: {exc}") from None
    return [t for t in (normalize_text(line, language) for line in lines) if t]


def lm_sentences(config: dict[str, Any]) -> list[list[str]]:
    """The sentences of each ``lang.lm_text`` entry (:func:`text_sentences`)."""
    return [text_sentences(entry, config["corpus"]["language"], config["corpus"]["download_dir"])
            for entry in config["lang"]["lm_text"]]


def write_lm(config: dict[str, Any], texts: list[str], out: Path) -> tuple[Arpa, dict[str, Any]]:
    """Write ``out/lm.arpa``; return it and what the manifest says of it. ``lang.lm_combine: pool``:
    ``lang.lm_arpa`` as given, or a Kneser-Ney model of order ``lang.lm_order`` over ``texts`` and the
    sentences of ``lang.lm_text``; ``interpolate``: :func:`interpolated_lm`. Pruned to ``lang.lm_max_ngrams``."""
    lang = config["lang"]
    info: dict[str, Any] = {}
    if lang["lm_combine"] == "interpolate":
        model, info = interpolated_lm(config, texts)
    elif lang["lm_arpa"]:
        model = read_arpa(lang["lm_arpa"])
    else:
        sentences = texts + [t for entry in lm_sentences(config) for t in entry]
        KneserNeyLM([t.split() for t in sentences], lang["lm_order"]).write_arpa(out / "lm.arpa")
        model = read_arpa(out / "lm.arpa")
    if lang["lm_max_ngrams"] is not None:
        model = prune_arpa(model, lang["lm_max_ngrams"])
    write_arpa(model, out / "lm.arpa")
    return model, info


def lm_vocabulary(texts: list[str], extra: list[str], external: Arpa | None, size: int | None,
                  pronounced: Callable[[str], bool]) -> set[str]:
    """The words of ``texts``, then those of ``extra`` sentences by frequency, then of ``external`` by unigram
    probability, up to ``size`` words in all (every word when ``size`` is None); ``extra`` and ``external``
    words only where ``pronounced`` says the lexicon has them."""
    vocabulary = {w for t in texts for w in t.split()}
    counts = Counter(w for t in extra for w in t.split())
    ranked = [w for w, _ in counts.most_common()]
    if external is not None:
        ranked += sorted(external.words - set(counts), key=lambda w: -external.prob[(w,)])
    for word in ranked:
        if size is not None and len(vocabulary) >= size:
            break
        if word not in vocabulary and pronounced(word):
            vocabulary.add(word)
    return vocabulary - {OOV_WORD}


def pronouncer(config: dict[str, Any]) -> Callable[[str], bool]:
    """Whether a word has a pronunciation other than its letters: in the lexicon file or the corpus's, else
    in CMUdict (every word does with ``lang.lexicon: grapheme``). Words of a general text that only
    graphemes could pronounce would bring letter units into a phone lexicon."""
    kind = config["lang"]["lexicon"]
    if kind == "grapheme":
        return lambda word: True
    given = lexicon_file(config) or {}
    return lambda word: word in given or bool(cmudict_pronunciations(word, config["lang"]["stress"]))


def interpolated_lm(config: dict[str, Any], texts: list[str]) -> tuple[Arpa, dict[str, Any]]:
    """The transcripts' model linearly interpolated with a model of each ``lang.lm_text`` entry and with
    ``lang.lm_arpa`` (:mod:`asrflow.lang.mix`), over :func:`lm_vocabulary` of size ``lang.lm_vocabulary``.

    The weights are ``lang.lm_weights`` or, when null, those that maximise the likelihood of every
    ``HELD_OUT_EVERY``-th transcript under a transcripts' model estimated without them; the
    transcripts' model of the mixture is then estimated on all of them."""
    lang, order = config["lang"], config["lang"]["lm_order"]
    texts_by_entry = lm_sentences(config)
    extra = [t for entry in texts_by_entry for t in entry]
    external = read_arpa(lang["lm_arpa"]) if lang["lm_arpa"] else None
    if not extra and external is None:
        raise LmError("lang.lm_combine is interpolate, but there is neither lang.lm_text nor lang.lm_arpa to "
                      "interpolate the transcripts' model with")
    vocabulary = lm_vocabulary(texts, extra, external, lang["lm_vocabulary"], pronouncer(config))
    others, names = [], []
    for entry, sentences in zip(lang["lm_text"], texts_by_entry):
        mapped = [[w if w in vocabulary else OOV_WORD for w in t.split()] for t in sentences]
        others.append(limit_vocabulary(KneserNeyLM(mapped, order).arpa(), vocabulary))
        names.append(entry)
    if external is not None:
        others.append(limit_vocabulary(external, vocabulary))
        names.append(lang["lm_arpa"])
    info: dict[str, Any] = {"components": ["transcripts", *names], "vocabulary": len(vocabulary)}
    if lang["lm_weights"] is not None:
        weights = list(lang["lm_weights"])
        if len(weights) != len(others) + 1:
            raise LmError(f"lang.lm_weights has {len(weights)} weights for {len(others) + 1} models "
                          f"({', '.join(info['components'])})")
    else:
        held = texts[::HELD_OUT_EVERY]
        rest = [t for i, t in enumerate(texts) if i % HELD_OUT_EVERY]
        if not held or not rest:
            raise LmError(f"{len(texts)} transcripts are too few to choose LM interpolation weights on every "
                          f"{HELD_OUT_EVERY}th of them: give lang.lm_weights")
        own = KneserNeyLM([t.split() for t in rest], order).arpa()
        held_words = [t.split() for t in held]
        weights, perplexity = mix_weights([own, *others], held_words)
        info["held_out"] = {"sentences": len(held), "perplexity": round(perplexity, 3)}
    info["weights"] = [round(w, 4) for w in weights]
    own = KneserNeyLM([t.split() for t in texts], order).arpa()
    return mix_arpa([own, *others], weights), info


def lm_has_transcripts(lang: dict[str, Any]) -> bool:
    """Whether the LM is estimated from the training split's transcripts: every LM but ``lang.lm_arpa`` used as
    given (``lm_combine: pool``)."""
    return lang["lm_combine"] == "interpolate" or not lang["lm_arpa"]


def lm_source(lang: dict[str, Any]) -> str:
    """What the LM was made of, in words, for the manifest."""
    if not lm_has_transcripts(lang):
        return lang["lm_arpa"]
    if lang["lm_combine"] == "interpolate":
        return " + ".join(["transcripts", *lang["lm_text"],
                           *([lang["lm_arpa"]] if lang["lm_arpa"] else [])]) + " (interpolated)"
    return "transcripts + lm_text" if lang["lm_text"] else "transcripts"


def lexicon_file(config: dict[str, Any]) -> dict[str, list[list[str]]] | None:
    """The pronunciations of ``lang.lexicon`` file (``lang.lexicon_file``) or corpus (the recipe's own
    ``lexicon``); None for cmudict and grapheme."""
    kind = config["lang"]["lexicon"]
    if kind == "file":
        return read_lexicon(config["lang"]["lexicon_file"])
    if kind != "corpus":
        return None
    from asrflow.corpus import CorpusError, recipe_from_config

    recipe = recipe_from_config(config["corpus"])
    if getattr(recipe, "lexicon", None) is None:
        raise CorpusError(f"lang.lexicon is corpus, but the {recipe.name} recipe has no lexicon of its own: "
                          f"use lexicon: file with lang.lexicon_file, cmudict or grapheme")
    return read_lexicon(recipe.lexicon)


def prepare_lang(config: dict[str, Any], data_dir: str | Path, train: str, tests: list[str],
                 out_dir: str | Path, log=print) -> dict[str, Any]:
    """Build the lang dir for training split ``train``; report OOV rates of ``tests``."""
    data_dir, out = Path(data_dir), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    lcfg = config["lang"]
    # corpus.extra_training utterances need pronunciations to be aligned, but the LM is the
    # experiment's own corpus's: the decoder chooses among its words only
    every_text = list(read_table(data_dir / train / "text").values())
    texts = list(own_texts(data_dir / train).values())
    lm, lm_info = write_lm(config, texts, out)
    vocabulary = sorted(lm.words - {OOV_WORD})
    lexicon, fallbacks = build_lexicon({w for t in every_text for w in t.split()} | set(vocabulary), lcfg["lexicon"],
                                       lexicon_file(config), lcfg["stress"])
    entries, max_disambig = add_disambig(lexicon)
    sil_disambig = max_disambig + 1
    silence, nonsilence = phone_inventory(lexicon)
    phones = phone_table(silence, nonsilence, sil_disambig)
    words = word_table(list(lexicon))
    write_table(out / "phones.txt", phones)
    write_table(out / "words.txt", words)
    pid = {p: i for i, p in enumerate(phones)}
    wid = {w: i for i, w in enumerate(words)}
    (out / "lexicon.txt").write_text("".join(f"{w} {' '.join(p)}\n" for w in sorted(lexicon) for p in lexicon[w]),
                                     encoding="utf-8")
    disambig = [pid[p] for p in phones if p.startswith("#")]
    (out / "disambig.int").write_text("".join(f"{i}\n" for i in disambig))
    (out / "silence.int").write_text("".join(f"{pid[p]}\n" for p in silence))
    (out / "nonsilence.int").write_text("".join(f"{pid[p]}\n" for p in nonsilence))
    (out / "oov.txt").write_text(f"{OOV_WORD}\n")
    (out / "topo").write_text(topology_text([pid[p] for p in nonsilence], [pid[p] for p in silence],
                                            lcfg["phone_states"], lcfg["silence_states"]))
    plain = [(w, [p for p in phs if not p.startswith("#")]) for w, phs in entries]
    lex = compile_text_fst(lexicon_fst_text(plain, SIL, lcfg["sil_prob"]), pid, wid)
    lex.write(str(out / "L.fst"))
    lex_d = compile_text_fst(lexicon_fst_text(entries, SIL, lcfg["sil_prob"], disambig_loop=True,
                                              sil_disambig=f"#{sil_disambig}"), pid, wid)
    lex_d.write(str(out / "L_disambig.fst"))
    # <unk> enters the LM only through training transcripts that contain it: an untrained
    # spoken-noise model with a floor probability only produces insertions.
    compile_grammar(out / "lm.arpa", out / "words.txt").write(str(out / "G.fst"))
    vocab_set = set(vocabulary)
    report: dict[str, Any] = {
        "train": train, "lexicon": lcfg["lexicon"], "words": len(vocabulary), "phones": len(nonsilence),
        "silence_phones": silence, "lm_order": lm.order, "lm_ngrams": lm.counts(),
        "lm_source": lm_source(lcfg),
        "grapheme_fallback_words": sum(s == "grapheme" for s in fallbacks.values()),
        "cmudict_fallback_words": sum(s == "cmudict" for s in fallbacks.values()),
        "train_perplexity": round(lm.perplexity([t.split() for t in texts]), 3), "test_sets": {},
    }
    for test in tests:
        test_texts = list(read_table(data_dir / test / "text").values())
        rate, n_oov, n_tokens = oov_rate(test_texts, vocab_set)
        report["test_sets"][test] = {"oov_rate": rate, "oov_tokens": n_oov, "tokens": n_tokens,
                                     "perplexity": round(lm.perplexity([t.split() for t in test_texts]), 3)}
        log(f"{test}: OOV rate {rate:.2%} ({n_oov}/{n_tokens}), perplexity {report['test_sets'][test]['perplexity']}")
    if lm_info:
        report["lm_mix"] = lm_info
    if len(texts) < len(every_text):
        report["extra_training_words"] = len(set(lexicon) - vocab_set - {SIL_WORD, OOV_WORD})
    (out / "manifest.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    log(f"lang for {train}: {len(vocabulary)} words, {len(nonsilence)} phones "
        f"(lexicon {lcfg['lexicon']}; {report['cmudict_fallback_words']} words from CMUdict, "
        f"{report['grapheme_fallback_words']} from graphemes), LM order {lm.order} with n-grams {lm.counts()}")
    return report
