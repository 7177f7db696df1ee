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
