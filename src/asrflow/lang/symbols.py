"""Kaldi lang-dir text artefacts: symbol tables, disambiguation symbols, topology, L.fst text.

These are pure functions of the lexicon; ``asrflow.lang.graph`` compiles them to FSTs.
"""

from __future__ import annotations

import math
from collections import Counter

from asrflow.lang.lm import BOS, EOS

EPS = "<eps>"


def add_disambig(lexicon: dict[str, list[list[str]]]) -> tuple[list[tuple[str, list[str]]], int]:
    """Kaldi's ``add_lex_disambig.pl``: append ``#1``, ``#2``, ... where needed.

    A pronunciation needs a disambiguation symbol when it is identical to another word's,
    or a proper prefix of another pronunciation. Returns ``(entries, max_disambig)``, where
    entries are ``(word, phones)`` in a stable order.
    """
    entries = [(w, list(p)) for w in sorted(lexicon) for p in lexicon[w]]
    counts = Counter(tuple(p) for _, p in entries)
    prefixes = {tuple(p[:i]) for _, p in entries for i in range(1, len(p))}
    seen: Counter = Counter()
    max_disambig = 0
    out = []
    for word, phones in entries:
        key = tuple(phones)
        if counts[key] > 1 or key in prefixes:
            seen[key] += 1
            phones = phones + [f"#{seen[key]}"]
            max_disambig = max(max_disambig, seen[key])
        out.append((word, phones))
    return out, max_disambig


def phone_table(silence: list[str], nonsilence: list[str], num_disambig: int) -> list[str]:
    """phones.txt order: ``<eps>``, silence phones, other phones, ``#0`` .. ``#num_disambig``."""
    return [EPS, *silence, *nonsilence, *(f"#{i}" for i in range(num_disambig + 1))]


def word_table(words: list[str]) -> list[str]:
    """words.txt order: ``<eps>``, sorted words, ``#0``, ``<s>``, ``</s>`` (Kaldi's layout)."""
    return [EPS, *sorted(set(words) - {EPS, BOS, EOS, "#0"}), "#0", BOS, EOS]


def write_table(path, symbols: list[str]) -> None:
    with open(path, "w", encoding="utf-8") as out:
        out.writelines(f"{s} {i}\n" for i, s in enumerate(symbols))


def topology_text(phone_ids: list[int], silence_ids: list[int], phone_states: int = 3,
                  silence_states: int = 5) -> str:
    """Kaldi topology: left-to-right ``phone_states`` for phones, ergodic-middle ``silence_states`` for silence."""
    def entry(ids: list[int], states: list[str]) -> list[str]:
        return ["<TopologyEntry>", "<ForPhones>", " ".join(map(str, ids)), "</ForPhones>", *states, "</TopologyEntry>"]

    normal = [f"<State> {s} <PdfClass> {s} <Transition> {s} 0.75 <Transition> {s + 1} 0.25 </State>"
              for s in range(phone_states)] + [f"<State> {phone_states} </State>"]
    n = silence_states
    sil = []
    for s in range(n):
        if s == 0:
            targets = list(range(0, n - 1))
        elif s < n - 1:
            targets = list(range(1, n))
        else:
            targets = [n - 1, n]
        prob = 0.75 if s == n - 1 else 1.0 / len(targets)
        trans = " ".join(f"<Transition> {t} {prob if s != n - 1 or t == n - 1 else 0.25:g}" for t in targets)
        sil.append(f"<State> {s} <PdfClass> {s} {trans} </State>")
    sil.append(f"<State> {n} </State>")
    lines = ["<Topology>"]
    if phone_ids:
        lines += entry(phone_ids, normal)
    if silence_ids:
        lines += entry(silence_ids, sil)
    return "\n".join(lines + ["</Topology>"]) + "\n"


def chain_topology_text(phone_ids: list[int]) -> str:
    """Kaldi's chain topology for every phone (``steps/nnet3/chain/gen_topo.py``): one state, left after a
    single frame or looped on, whose first frame (the ``forward`` pdf class 0) and later frames (the
    self-loop's pdf class 1) are modelled apart. A phone then lasts one frame or more, which suits a
    network that outputs every third frame."""
    return "\n".join(["<Topology>", "<TopologyEntry>", "<ForPhones>", " ".join(map(str, sorted(phone_ids))),
                      "</ForPhones>",
                      "<State> 0 <ForwardPdfClass> 0 <SelfLoopPdfClass> 1 <Transition> 0 0.5 <Transition> 1 0.5 "
                      "</State>", "<State> 1 </State>", "</TopologyEntry>", "</Topology>"]) + "\n"


def lexicon_fst_text(entries: list[tuple[str, list[str]]], sil_phone: str, sil_prob: float,
                     disambig_loop: bool = False, sil_disambig: str | None = None) -> str:
    """Text FST of the lexicon with optional silence (Kaldi's ``make_lexicon_fst.py``).

    States: 0 start, 1 loop (after a word, no silence), 2 silence (then a SIL arc to 1).
    Input labels are phones, outputs words. With ``disambig_loop`` a ``#0:#0`` self-loop on
    the loop state passes G's back-off disambiguation symbol through, and ``sil_disambig``
    follows the optional silence (``L_disambig``, as ``prepare_lang.sh``).
    """
    if not 0.0 < sil_prob < 1.0:
        raise ValueError("sil_prob must be strictly between 0 and 1")
    no_sil, sil = -math.log(1.0 - sil_prob), -math.log(sil_prob)
    lines = [f"0 1 {EPS} {EPS} {no_sil:.6f}", f"0 2 {EPS} {EPS} {sil:.6f}"]
    next_state = 3
    if sil_disambig:
        lines += [f"2 3 {sil_phone} {EPS} 0", f"3 1 {sil_disambig} {EPS} 0"]
        next_state = 4
    else:
        lines.append(f"2 1 {sil_phone} {EPS} 0")
    for word, phones in entries:
        src = 1
        for i, phone in enumerate(phones):
            out_word = word if i == 0 else EPS
            if i == len(phones) - 1:
                lines.append(f"{src} 1 {phone} {out_word} {no_sil:.6f}")
                lines.append(f"{src} 2 {phone} {out_word} {sil:.6f}")
            else:
                lines.append(f"{src} {next_state} {phone} {out_word} 0")
                src, next_state = next_state, next_state + 1
    if disambig_loop:
        lines.append("1 1 #0 #0 0")
    lines.append("1 0")
    return "\n".join(lines) + "\n"
