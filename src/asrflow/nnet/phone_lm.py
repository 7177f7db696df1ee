"""A phone-LM denominator graph for MMI (lattice-free MMI as in Kaldi's chain recipes).

MMI against the decoding graph (``nnet/mmi.py``) sums over every word sequence the decoder
could output; its forward-backward costs frames × arcs, which a large-vocabulary trigram HCLG
makes too dear. Kaldi's chain models use a phone n-gram LM instead: the denominator becomes
every phone sequence, weighted by how often the training alignments show it, with no lexicon
or word LM behind it. Here it is built with the same recipe as the decoding graph
(``lang/graph.py: make_hclg``) by treating each phone as a word:

- "words" are the lang's phones, silence included; the lexicon is a one-state loop that
  reads a phone and writes the same phone-word (plus ``#0`` for the LM's back-off arcs);
- the grammar is a Kneser-Ney n-gram over the phone sequences of the GMM's training
  alignments (runs of a frame's phone collapsed: two equal phones in a row across a word
  boundary count once, which only thins the LM a little);
- H, C and the tree are the GMM's, so the graph's pdfs are the network's output classes.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from asrflow.gmm.alignments import alignment_index, read_alignments
from asrflow.kaldi import kfst
from asrflow.lang.graph import compile_text_fst, make_hclg, read_symbols
from asrflow.lang.stage import write_grammar
from asrflow.lang.symbols import EPS, word_table, write_table
from asrflow.nnet import NnetError


def phone_sequences(frame_phones: Iterable[np.ndarray], id2phone: Mapping[int, str]) -> list[list[str]]:
    """Each utterance's phone sequence from its frame-level phone ids (``ali/phones``), runs of one phone
    collapsed, as the symbols ``id2phone`` names."""
    sequences = []
    for phones in frame_phones:
        phones = np.asarray(phones)
        if len(phones):
            runs = phones[np.concatenate(([True], phones[1:] != phones[:-1]))]
            sequences.append([id2phone.get(int(p), str(int(p))) for p in runs])
    return sequences


def phone_loop_text(phones: list[str]) -> str:
    """Text FST of the phone "lexicon": one state, each phone read and written as its phone-word,
    ``#0:#0`` passed through for the grammar's back-off arcs."""
    return "".join(f"0 0 {p} {p}\n" for p in phones) + "0 0 #0 #0\n0\n"


def phone_lm_graph(lang_dir: str | Path, ali_dir: str | Path, model: Any, order: int) -> tuple[Any, float]:
    """The HCLG of an order-``order`` phone LM over the frame phones in ``ali_dir/ali/phones.scp``,
    for ``model`` (a :class:`~asrflow.gmm.model.GmmModel`: its tree and transition model) and the
    phones of ``lang_dir``. Returns the FST and the LM's training perplexity."""
    lang_dir, ali_path = Path(lang_dir), alignment_index(Path(ali_dir) / "ali", "phones")
    if not ali_path.is_file():
        raise FileNotFoundError(f"the phone-LM denominator needs the GMM's frame alignments {ali_path}")
    phone_ids = read_symbols(lang_dir / "phones.txt")
    phones = [p for p in phone_ids if p != EPS and not p.startswith("#")]
    sequences = phone_sequences(read_alignments(ali_path.parent, "phones").values(),
                                {i: p for p, i in phone_ids.items()})
    unknown = sorted({p for s in sequences for p in s} - set(phones))
    if unknown:
        raise NnetError(f"{ali_path}: phone ids {unknown[:5]} are not phones of {lang_dir / 'phones.txt'} "
                        f"(alignments of another lang?)")
    disambig = [int(x) for x in (lang_dir / "disambig.int").read_text().split()]
    words = word_table(phones)
    with tempfile.TemporaryDirectory(prefix="asrflow-phone-lm-") as tmp:
        write_table(Path(tmp) / "words.txt", words)
        lm = write_grammar([" ".join(s) for s in sequences], phones, order, Path(tmp))  # the lang stage's LM → G
        grammar = kfst.StdVectorFst.read(str(Path(tmp) / "G.fst"))
    lexicon = compile_text_fst(phone_loop_text(phones), phone_ids, {w: i for i, w in enumerate(words)})
    graph = make_hclg(lexicon, grammar, model.tree, model.tm, disambig, self_loop_scale=model.self_loop_scale)
    return graph, lm.perplexity(sequences)
