"""FSTs of a lang dir and the decoding graph HCLG (Kaldi's ``mkgraph.sh`` with the wheels).

mkgraph.sh steps and what stands in for the ones kaldifst lacks:
LG = min(det(L_disambig ∘ G)) (``fstpushspecial`` is not available and is skipped);
CLG = C ∘ LG (``compose_context``); Ha from the tree and transition model;
HCLGa = det(Ha ∘ CLG) with the disambiguation transition-ids then mapped to ε
(``fstrmsymbols``), ε-removal (for ``fstrmepslocal``) and minimisation; HCLG = self-loops
added (self-loop scale 0.1), arc-sorted.
"""

from __future__ import annotations

from pathlib import Path

from asrflow.kaldi import kaldilm, kfst, khg, map_input_labels


def read_symbols(path: str | Path) -> dict[str, int]:
    """A Kaldi symbol table (``symbol id`` per line)."""
    table = {}
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        if line.strip():
            sym, idx = line.rsplit(" ", 1)
            table[sym] = int(idx)
    return table


def compile_text_fst(text: str, isyms: dict[str, int], osyms: dict[str, int]):
    """Compile an FST from text with symbolic labels (``src dst ilabel olabel [weight]``)."""
    lines = []
    for line in text.splitlines():
        f = line.split()
        if len(f) >= 4:
            f[2], f[3] = str(isyms[f[2]]), str(osyms[f[3]])
        lines.append(" ".join(f))
    return kfst.compile("\n".join(lines) + "\n")


def compile_grammar(arpa: str | Path, words_txt: str | Path):
    """G.fst from an ARPA LM (kaldilm's arpa2fst, ``#0`` on back-off arcs), input-label sorted."""
    text = kaldilm.arpa2fst(input_arpa=str(arpa), disambig_symbol="#0", read_symbol_table=str(words_txt))
    grammar = kfst.compile(text)
    kfst.arcsort(grammar, sort_type="ilabel")
    return grammar


def make_hclg(lexicon_disambig, grammar, tree, trans_model, disambig_phones: list[int],
              transition_scale: float = 1.0, self_loop_scale: float = 0.1):
    """Build HCLG for an acoustic model (its tree and transition model)."""
    kfst.arcsort(lexicon_disambig, sort_type="olabel")
    lg = kfst.compose(lexicon_disambig, grammar)
    kfst.determinize_star(lg, use_log=True)
    kfst.minimize_encoded(lg)
    clg, ilabels = kfst.compose_context(disambig_syms=disambig_phones, context_width=tree.context_width,
                                        central_position=tree.central_position, ifst=lg)
    kfst.arcsort(clg, sort_type="ilabel")
    ha, disambig_tids = khg.get_h_transducer(ilabel_info=ilabels, ctx_dep=tree, trans_model=trans_model,
                                             config=khg.HTransducerConfig(transition_scale=transition_scale))
    hclga = kfst.compose(ha, clg)
    kfst.determinize_star(hclga, use_log=True)
    hclga = map_input_labels(hclga, set(disambig_tids))
    kfst.rmepsilon(hclga)
    kfst.minimize_encoded(hclga)
    hclg = khg.add_self_loops(self_loop_scale=self_loop_scale, disambig_syms=[], reorder=True,
                              trans_model=trans_model, ifst=hclga)
    kfst.arcsort(hclg, sort_type="ilabel")
    return hclg


def ctc_topology(unit_phones: list[int], disambig_phones: list[int]):
    """CTC token FST T: input labels are CTC classes + 1 (1 = blank, ``k + 1`` = unit ``k``), outputs phone ids.

    State 0 follows a blank (or the start), state ``k`` unit ``k``: a unit is emitted when it
    is entered from the blank state or from a different unit, its repeats and the blanks
    after it emit nothing, and every state is final. Each disambiguation phone ``#i`` gets a
    self-loop on every state with a fresh input label (``len(unit_phones) + 2 + i``) that
    :func:`make_tlg` turns into ε after determinisation. Returns ``(T, auxiliary input labels)``.
    """
    units = len(unit_phones)
    lines = ["0 0 1 0"]
    for k, phone in enumerate(unit_phones, start=1):
        lines += [f"0 {k} {k + 1} {phone}", f"{k} {k} {k + 1} 0", f"{k} 0 1 0"]
        lines += [f"{k} {j} {j + 1} {other}" for j, other in enumerate(unit_phones, start=1) if j != k]
    aux = [units + 2 + i for i in range(len(disambig_phones))]
    for label, phone in zip(aux, disambig_phones):
        lines += [f"{s} {s} {label} {phone}" for s in range(units + 1)]
    lines += [str(s) for s in range(units + 1)]
    topo = kfst.compile("\n".join(lines) + "\n")
    kfst.arcsort(topo, sort_type="olabel")
    return topo, aux


def make_tlg(lexicon_disambig, grammar, unit_phones: list[int], disambig_phones: list[int],
             silence_phones: list[int]):
    """Build TLG for a CTC network over phones (EESEN's ``ctc_compile_dict_token.sh`` with the wheels).

    The optional silence of L becomes ε (CTC's blank covers pauses); LG = min(det(L ∘ G));
    TLG = det(T ∘ LG) with the disambiguation labels then mapped to ε, ε-removal and
    minimisation, arc-sorted on input for the decoder.
    """
    lexicon = map_input_labels(lexicon_disambig, set(silence_phones))
    kfst.arcsort(lexicon, sort_type="olabel")
    lg = kfst.compose(lexicon, grammar)
    kfst.determinize_star(lg, use_log=True)
    kfst.minimize_encoded(lg)
    topo, aux = ctc_topology(unit_phones, disambig_phones)
    tlg = kfst.compose(topo, lg)
    kfst.determinize_star(tlg, use_log=True)
    tlg = map_input_labels(tlg, set(aux))
    kfst.rmepsilon(tlg)
    kfst.minimize_encoded(tlg)
    kfst.arcsort(tlg, sort_type="ilabel")
    return tlg
