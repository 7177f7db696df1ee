"""The lang stage: lexicon, phone/word tables, topology, L, LM (ARPA) and G for one training split.

The lexicon covers every training transcript, ``corpus.extra_training`` ones included, and every
word of the LM; the LM (and so the decoder's vocabulary) is estimated from the experiment's own
corpus's transcripts and ``lang.lm_text``, or read from ``lang.lm_arpa``, and pruned to
``lang.lm_max_ngrams``.

Output folder (``results/<exp>/lang/<train split>/``), Kaldi's lang-dir layout::

    lexicon.txt  phones.txt  words.txt  topo  disambig.int  silence.int  nonsilence.int
    L.fst  L_disambig.fst  lm.arpa  G.fst  manifest.json (sizes, OOV rate per test set, perplexity)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from asrflow.data.datadir import own_texts, read_table
from asrflow.lang.arpa import Arpa, LmError, prune_arpa, read_arpa, write_arpa
from asrflow.lang.graph import compile_grammar, compile_text_fst
from asrflow.lang.lexicon import OOV_WORD, SIL, SIL_WORD, build_lexicon, oov_rate, phone_inventory, read_lexicon
from asrflow.lang.lm import KneserNeyLM
from asrflow.lang.symbols import add_disambig, lexicon_fst_text, phone_table, topology_text, word_table, write_table
from asrflow.text.normalize import normalize_text


def write_grammar(texts: list[str], vocabulary: list[str], order: int, out: Path) -> KneserNeyLM:
    """Estimate the n-gram LM of ``texts`` over ``vocabulary``; write ``lm.arpa`` and ``G.fst`` (over
    ``out/words.txt``) into ``out``."""
    lm = KneserNeyLM([t.split() for t in texts], order, vocabulary=vocabulary)
    lm.write_arpa(out / "lm.arpa")
    compile_grammar(out / "lm.arpa", out / "words.txt").write(str(out / "G.fst"))
    return lm


def lm_sentences(paths: list[str], language: str) -> list[str]:
    """The sentences of ``lang.lm_text`` files (one a line), normalised as transcripts are; empty lines dropped."""
    out = []
    for path in paths:
        try:
            lines = Path(path).read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise LmError(f"lang.lm_text: cannot read {path}: {exc}") from None
        out += [t for t in (normalize_text(line, language) for line in lines) if t]
    return out


def write_lm(config: dict[str, Any], texts: list[str], out: Path) -> Arpa:
    """Write ``out/lm.arpa`` and return it: ``lang.lm_arpa`` as given, or a Kneser-Ney model of order
    ``lang.lm_order`` over ``texts`` and the sentences of ``lang.lm_text``; pruned to ``lang.lm_max_ngrams``."""
    lang = config["lang"]
    if lang["lm_arpa"]:
        model = read_arpa(lang["lm_arpa"])
    else:
        sentences = texts + lm_sentences(lang["lm_text"], config["corpus"]["language"])
        KneserNeyLM([t.split() for t in sentences], lang["lm_order"]).write_arpa(out / "lm.arpa")
        model = read_arpa(out / "lm.arpa")
    if lang["lm_max_ngrams"] is not None:
        model = prune_arpa(model, lang["lm_max_ngrams"])
    write_arpa(model, out / "lm.arpa")
    return model


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
    lm = write_lm(config, texts, out)
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
        "lm_source": lcfg["lm_arpa"] or ("transcripts + lm_text" if lcfg["lm_text"] else "transcripts"),
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
    if len(texts) < len(every_text):
        report["extra_training_words"] = len(set(lexicon) - vocab_set - {SIL_WORD, OOV_WORD})
    (out / "manifest.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    log(f"lang for {train}: {len(vocabulary)} words, {len(nonsilence)} phones "
        f"(lexicon {lcfg['lexicon']}; {report['cmudict_fallback_words']} words from CMUdict, "
        f"{report['grapheme_fallback_words']} from graphemes), LM order {lm.order} with n-grams {lm.counts()}")
    return report
