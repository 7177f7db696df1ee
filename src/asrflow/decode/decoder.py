"""Decode shards of utterances with a GMM-HMM and its HCLG graph (``gmm-decode-faster``, 1-best).

The GMM's log-likelihoods of every pdf are computed for a whole utterance at once (a few
matrix products) and searched by Kaldi's faster decoder, which keeps no lattice: every
consumer reads only the best path. Workers cache the graph by path and modification time
(and the word insertion penalty folded into it), held as a ConstFst, the type Kaldi's
``mkgraph.sh`` writes HCLG.fst in (:func:`searchable`); each task reports the decoding time so the
real-time factor excludes graph loading. A tuning search, which decodes the same shards once per
step, asks workers to keep each shard's scores too (:func:`kept_scores`).
"""

from __future__ import annotations

import hashlib
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from asrflow.gmm.estep import Shard, features
from asrflow.gmm.model import GmmModel
from asrflow.kaldi import add_word_penalty, kfst, khg

# Never prune below this many active states (Kaldi's lattice-faster default; its faster decoder's 20
# prunes a small graph such as yesno's by the beam alone, and misses final states the wider search keeps).
MIN_ACTIVE = 200
_GRAPHS: dict[tuple, object] = {}
#: Penalised copies of a graph, by (graph, penalty), most recently used last; at most :data:`PENALISED_GRAPHS`.
_PENALISED: OrderedDict[tuple, object] = OrderedDict()
#: How many penalised copies a worker keeps beside the graph as read: two serve a tuning batch that decodes
#: every shard at two penalties (a walk's step each way) without composing each graph again per shard.
PENALISED_GRAPHS = 2
#: Shards' frame counts and score matrices kept by :func:`kept_scores`, by (model, shard).
_KEPT: dict[tuple, tuple[list[int], list[np.ndarray]]] = {}
#: The most bytes of scores a worker keeps: a large corpus's tuning set may hold more, and the shards beyond it
#: are scored again on every decode.
KEEP_BYTES = 1 << 30


@dataclass
class DecodeOptions:
    beam: float = 13.0
    max_active: int = 7000
    acoustic_scale: float = 0.1
    insertion_penalty: float = 0.0  # added to the graph cost of every output word
    frame_shift: float = 0.01


def gmm_decode_options(decode: dict) -> DecodeOptions:
    """A GMM's decoder settings from the config's ``decode`` section."""
    return DecodeOptions(beam=decode["beam"], max_active=decode["max_active"], acoustic_scale=decode["acoustic_scale"],
                         insertion_penalty=decode.get("insertion_penalty", 0.0))


def gmm_decodable(model: GmmModel, feats: np.ndarray, scale: float):
    """The GMM's scaled log-likelihoods of ``feats`` for Kaldi's decoder, one column per transition id.

    Every pdf is evaluated on every frame (:meth:`GmmModel.pdf_loglikes`): at the beams that matter
    this is a fraction of what evaluating the visited pdfs one at a time costs.
    """
    return khg.DecodableCtc(transition_columns(model.pdf_loglikes(feats), model.tid2pdf, scale))


def transition_columns(pdf_scores: np.ndarray, tid2pdf: np.ndarray, scale: float) -> np.ndarray:
    """Scaled per-pdf (pseudo-)log-likelihoods laid out as the decoder reads an HCLG's: column ``t - 1`` for
    transition id ``t`` (GMMs here, hybrids in :func:`asrflow.nnet.hybrid.transition_loglikes`)."""
    return np.ascontiguousarray(scale * pdf_scores[:, tid2pdf[1:]], dtype=np.float32)


@dataclass
class DecodeResult:
    hyps: dict[str, list[str]]  # utterance -> words
    failed: list[str]
    frames: int
    seconds: float
    partial: list[str] = field(default_factory=list)  # searched to the end but reached no final state


def _graph(path: str, penalty: float = 0.0) -> tuple[object, list[str]]:
    """The graph (with ``penalty`` per output word) and its word list (``words.txt`` beside it), cached per worker.

    Besides the graph as read, the last :data:`PENALISED_GRAPHS` penalised copies are kept (a tuning
    search walks the penalties, a step or two at a time); the oldest goes before a new one is
    composed, so a worker never holds more than that many copies and the one being built.
    """
    key = (path, os.stat(path).st_mtime_ns)
    if penalty:
        graph, id2word = _graph(path)
        if (key, penalty) in _PENALISED:
            _PENALISED.move_to_end((key, penalty))
        else:
            while len(_PENALISED) >= PENALISED_GRAPHS:
                _PENALISED.popitem(last=False)
            _PENALISED[key, penalty] = searchable(add_word_penalty(graph, penalty, len(id2word) - 1))
        return _PENALISED[key, penalty], id2word
    if key not in _GRAPHS:
        words = {}
        for line in (Path(path).parent / "words.txt").read_text(encoding="utf-8").splitlines():
            word, index = line.split()
            words[int(index)] = word
        id2word = [words.get(i, "") for i in range(max(words) + 1)]
        _GRAPHS[key] = (searchable(kfst.StdVectorFst.read(path)), id2word)
    return _GRAPHS[key]


def searchable(fst):
    """``fst`` as a ConstFst: its states and arcs in two contiguous arrays, which Kaldi's decoders search
    faster than a VectorFst's separately allocated states (speechocean762's 5.3 M-state HCLG: the same
    words in 8 % less search time with sat's GMM, 0-2 % with the tdnn's scores; docs/gmm.md). The wheels
    read only vector FSTs from disk, so graphs stay vector files and are converted once per worker as they
    are loaded."""
    return fst if fst.type == "const" else kfst.StdConstFst(fst)


def shard_key(shard: Shard) -> tuple | None:
    """What a shard's scores depend on besides the model: its utterances, feature locations and normalisation
    (None for a shard through a projection, which is not compared)."""
    if shard.projection is not None:
        return None
    return shard.key, shard.deltas, shard.per_utterance, hashlib.blake2b(shard.payload, digest_size=16).digest()


def kept_scores(model: tuple | None, shard: Shard,
                score: Callable[[], tuple[list[int], list[np.ndarray]]]) -> tuple[list[int], list[np.ndarray]]:
    """``score()`` of ``shard`` (each utterance's frames and score matrix), kept in the worker under ``model``
    (what identifies the model; None: nothing kept) and given again for the same model and shard.

    A tuning search decodes its held-out shards once per step, and Dask sends each shard to
    the same worker every time, so the acoustic model runs once per shard. Scores of another
    model are let go; those that would take the worker past :data:`KEEP_BYTES` are not kept.
    """
    shard_id = shard_key(shard) if model is not None else None
    if shard_id is None:
        return score()
    key = (model, shard_id)
    if key in _KEPT:
        return _KEPT[key]
    out = score()
    for other in [k for k in _KEPT if k[0] != model]:
        del _KEPT[other]
    if sum(m.nbytes for _, mats in _KEPT.values() for m in mats) + sum(m.nbytes for m in out[1]) <= KEEP_BYTES:
        _KEPT[key] = out
    return out


def min_active(max_active: int) -> int:
    """The fewest states a search keeps: :data:`MIN_ACTIVE`, below ``max_active`` (as Kaldi's decoders require)."""
    if max_active < 2:
        raise ValueError(f"max_active is {max_active}: Kaldi's decoders need at least 2 active states")
    return min(MIN_ACTIVE, max_active - 1)


def decode_all(graph_path: str, opts: DecodeOptions,
               decodables: Iterable[tuple[str, int, Callable[[], object]]]) -> DecodeResult:
    """Run Kaldi's faster decoder (``decode-faster``) over ``(utt, frames, make_decodable)`` items; 1-best words.

    Shared by every acoustic model: each gives a matrix of (pseudo-)log-likelihoods whose
    columns are the graph's input labels less one (transition ids of an HCLG, CTC classes of a
    TLG). The best path ends in a final state where the search reached one, with its final
    weight; else it is the best partial path (the utterance is listed in ``partial``). An
    utterance with no surviving path is failed. Only the best path is ever read, so no lattice
    is kept: with the same beams (and :data:`MIN_ACTIVE`) it finds the words Kaldi's
    lattice-faster decoder finds, in less time (:func:`lattice_search`, ``asrflow bench decode
    --lattice``).
    """
    graph, id2word = _graph(graph_path, opts.insertion_penalty)
    return _faster_search(graph, id2word, opts, decodables)


def vector_search(graph_path: str, opts: DecodeOptions,
                  decodables: Iterable[tuple[str, int, Callable[[], object]]]) -> DecodeResult:
    """:func:`decode_all`'s search through the graph as read from disk, a VectorFst (the insertion penalty
    composed in), not converted to a ConstFst: the reference ``asrflow bench … --vector`` times it against."""
    _, id2word = _graph(graph_path)
    graph = kfst.StdVectorFst.read(graph_path)
    if opts.insertion_penalty:
        graph = add_word_penalty(graph, opts.insertion_penalty, len(id2word) - 1)
    return _faster_search(graph, id2word, opts, decodables)


def _faster_search(graph, id2word: list[str], opts: DecodeOptions,
                   decodables: Iterable[tuple[str, int, Callable[[], object]]]) -> DecodeResult:
    """Kaldi's faster decoder through ``graph`` over the decodables (:func:`decode_all`)."""
    decoder = khg.FasterDecoder(graph, khg.FasterDecoderOptions(beam=opts.beam, max_active=opts.max_active,
                                                                 min_active=min_active(opts.max_active)))

    def best_path(utt: str, decodable: object) -> tuple[bool, list[int], bool]:
        decoder.decode(decodable)
        final = decoder.reached_final()
        ok, path = decoder.get_best_path(use_final_probs=True)
        return ok, (kfst.get_linear_symbol_sequence(path)[2] if ok else []), final

    return _search(decodables, id2word, best_path)


def lattice_search(graph_path: str, trans_model, opts: DecodeOptions,
                   decodables: Iterable[tuple[str, int, Callable[[], object]]]) -> DecodeResult:
    """:func:`decode_all`'s search done by Kaldi's lattice-faster decoder (``gmm-latgen-faster``) with a lattice
    one unit wide, the same beams and :data:`MIN_ACTIVE`: the reference that ``asrflow bench decode --lattice``
    times the faster decoder against (an HCLG's, whose input labels are transition ids of ``trans_model``).
    The wheels do not say whether it reached a final state, so ``partial`` stays empty."""
    graph, id2word = _graph(graph_path, opts.insertion_penalty)
    config = khg.LatticeFasterDecoderConfig(beam=opts.beam, max_active=opts.max_active,
                                            min_active=min_active(opts.max_active), lattice_beam=1.0)
    decoder = khg.LatticeFasterDecoder(graph, config)

    def best_path(utt: str, decodable: object) -> tuple[bool, list[int], bool]:
        ok, _, words, _ = khg.decode_utterance_lattice_faster(decoder=decoder, decodable=decodable,
                                                              trans_model=trans_model, utt=utt, allow_partial=True)
        return ok, words, True

    return _search(decodables, id2word, best_path)


def _search(decodables: Iterable[tuple[str, int, Callable[[], object]]], id2word: list[str],
            best_path: Callable[[str, object], tuple[bool, list[int], bool]]) -> DecodeResult:
    """The loop both decoders share, timed: ``best_path(utt, decodable)`` gives (a path survived, its word
    ids, it ends in a final state)."""
    hyps, failed, partial, total = {}, [], [], 0
    start = time.perf_counter()
    for utt, frames, make in decodables:
        ok, words, final = best_path(utt, make())
        hyps[utt] = words_of([int(w) for w in words], id2word).split() if ok else []
        if not ok:
            failed.append(utt)
        elif not final:
            partial.append(utt)
        total += frames
    return DecodeResult(hyps, failed, total, time.perf_counter() - start, partial)


def lattice_comparison(graph_path: str, trans_model, opts: DecodeOptions,
                       decodables: list[tuple[str, int, Callable[[], object]]], result: DecodeResult) -> dict:
    """The same ``decodables`` searched by :func:`lattice_search`, against ``result`` (:func:`decode_all`'s
    search of them): the lattice decoder's search RTF, the speed-up and the utterances whose words differ."""
    return _against(lattice_search(graph_path, trans_model, opts, decodables), result, opts,
                    ("lattice_rtf_search", "search_speedup", "words_differ"))


def vector_comparison(graph_path: str, opts: DecodeOptions,
                      decodables: list[tuple[str, int, Callable[[], object]]], result: DecodeResult) -> dict:
    """The same ``decodables`` searched by :func:`vector_search`, against ``result`` (:func:`decode_all`'s search of
    them through the ConstFst): the VectorFst's search RTF, the speed-up and the utterances whose words differ."""
    return _against(vector_search(graph_path, opts, decodables), result, opts,
                    ("vector_rtf_search", "const_speedup", "vector_words_differ"))


def _against(reference: DecodeResult, result: DecodeResult, opts: DecodeOptions, keys: tuple[str, str, str]) -> dict:
    """A reference search's RTF, how many times its time ``result``'s is, and the utterances whose words
    differ, under ``keys``."""
    rtf_key, speedup_key, differ_key = keys
    return {rtf_key: round(reference.seconds / (reference.frames * opts.frame_shift), 4),
            speedup_key: round(reference.seconds / max(result.seconds, 1e-9), 2),
            differ_key: sum(reference.hyps[u] != result.hyps[u] for u in result.hyps)}


def per_setting(settings: list[DecodeOptions],
                search: Callable[[DecodeOptions], DecodeResult]) -> list[DecodeResult]:
    """``search(options)`` for each setting, grouped by insertion penalty (each penalised graph is then
    built once, :func:`_graph`); the results in the order of ``settings``."""
    results: list[DecodeResult | None] = [None] * len(settings)
    for i in sorted(range(len(settings)), key=lambda i: settings[i].insertion_penalty):
        results[i] = search(settings[i])
    return results


def decode_settings(utts: list[str], frames: list[int], posteriors: list[np.ndarray], forward: float,
                    graph_path: str, settings: list[DecodeOptions],
                    loglikes: Callable[[np.ndarray, DecodeOptions], np.ndarray]) -> list[DecodeResult]:
    """Search a graph once per setting with one network forward pass (``posteriors``, which took ``forward`` s).

    ``loglikes(posteriors, options)`` lays out one utterance's decodable matrix. Settings run
    grouped by insertion penalty, so each penalised graph is built once; the results come back
    in the order of ``settings``, each timed with the forward pass included.
    """
    def search(opts: DecodeOptions) -> DecodeResult:
        items = [(utt, n, lambda p=p: khg.DecodableCtc(loglikes(p, opts)))
                 for utt, n, p in zip(utts, frames, posteriors)]
        result = decode_all(graph_path, opts, items)
        result.seconds += forward
        return result

    return per_setting(settings, search)


def decode_shard_settings(shard: Shard, model_blob: bytes, graph_path: str,
                          settings: list[DecodeOptions], keep: bool = False) -> list[DecodeResult]:
    """1-best words of each utterance of a shard with a GMM-HMM, once per decoder setting (runs on a Dask
    worker; :func:`per_setting`).

    Every pdf's log-likelihoods are computed once per utterance and shared by all the searches,
    each result's time including that computation; ``keep``: kept for the next call
    (:func:`kept_scores`).
    """
    model = GmmModel.from_bytes(model_blob)
    start = time.perf_counter()

    def score() -> tuple[list[int], list[np.ndarray]]:
        feats = features(shard)
        return [x.shape[0] for x in feats], [model.pdf_loglikes(x) for x in feats]

    model_key = ("gmm", hashlib.blake2b(model_blob, digest_size=16).digest()) if keep else None
    frames, loglikes = kept_scores(model_key, shard, score)
    return decode_settings(list(shard.utts), frames, loglikes, time.perf_counter() - start,
                           graph_path, settings,
                           lambda p, opts: transition_columns(p, model.tid2pdf, opts.acoustic_scale))


def words_of(ids: list[int], id2word: list[str]) -> str:
    """Word ids to text, dropping ``<eps>`` and ``<SIL>``-style non-words."""
    return " ".join(id2word[i] for i in ids if id2word[i] not in ("<eps>", "<SIL>"))


def rtf(results: list[DecodeResult], frame_shift: float = 0.01) -> float:
    """Decoding seconds over audio seconds."""
    frames = sum(r.frames for r in results)
    return float(np.sum([r.seconds for r in results]) / (frames * frame_shift)) if frames else 0.0
