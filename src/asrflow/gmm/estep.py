"""The E-step of GMM-HMM training, as Dask tasks over shards of utterances.

Every task is a pure function of (model, shard, alignments): it may run on any worker,
twice, or after a worker died, and give the same statistics. Workers only *cache* what
they can rebuild (compiled training graphs), within ``dask.cache_mb``
(:mod:`asrflow.cluster.cache`); features are read again on every pass. Alignments live in archives: a task
that aligns writes its shard's into one with its index (:func:`asrflow.gmm.alignments.write_archive`) and
returns the index's path; a task that accumulates is given the references and reads them.

Tasks return plain numpy arrays (the wheels' accumulators do not pickle): per-Gaussian
occupancy, first and second-order sums in the model's flat Gaussian order, transition
counts, and the log-likelihood.
"""

from __future__ import annotations

import functools
import hashlib
import pickle
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from asrflow.cluster.cache import Cache
from asrflow.features import Projection, add_deltas, apply_cmvn, load
from asrflow.gmm.alignments import Alignment, Written, archive_index, load_alignment, write_archive
from asrflow.gmm.model import GmmModel
from asrflow.kaldi import kfst, khg

_COMPILERS: dict[tuple, object] = {}  # one per (lang, tree)
_GRAPHS = Cache()  # (lang, tree, transcript word ids) -> its training graph
_GRAPH_TREE: list[tuple[str, bytes]] = []  # the (lang, tree) whose graphs _GRAPHS holds
_KEEP: list = []  # objects the C++ graph compiler references (never freed while it lives)


@dataclass(frozen=True)
class Shard:
    """A fixed group of utterances with everything a worker needs to process them.

    The driver reads only ``key``, ``utts`` and ``speakers``; what only workers read (feature locations,
    transcripts as word ids, the speakers' CMVN statistics) travels as one compressed ``payload``
    (:meth:`pack`), about a tenth of its size as Python objects, so the driver's memory for a split of
    100 h is a few MB, not tens.
    """

    key: str
    utts: tuple[str, ...]
    speakers: tuple[str, ...]
    payload: bytes  # zlib-compressed pickle of (feats, word_ids, cmvn)
    lang_dir: str
    deltas: int = 2
    per_utterance: bool = False  # each utterance normalised by its own mean (a network's cmvn: utterance)
    projection: Projection | None = None  # spliced frames through LDA+MLLT (then deltas is 0)

    @staticmethod
    def pack(feats: tuple[str, ...], word_ids: tuple[tuple[int, ...], ...], cmvn: dict) -> bytes:
        """The payload of a shard: feature locations (scp values ``<ark>:<offset>``), transcripts as word ids, and
        speaker → Kaldi CMVN statistics (2, dim + 1; empty with ``per_utterance``)."""
        return zlib.compress(pickle.dumps((feats, word_ids, cmvn), protocol=pickle.HIGHEST_PROTOCOL), 1)

    @property
    def feats(self) -> tuple[str, ...]:
        return _unpack(self.payload)[0]

    @property
    def word_ids(self) -> tuple[tuple[int, ...], ...]:
        return _unpack(self.payload)[1]

    @property
    def cmvn(self) -> dict:
        return _unpack(self.payload)[2]


@functools.lru_cache(maxsize=4)
def _unpack(payload: bytes) -> tuple:
    """A shard's payload read back (the last few kept: a task reads its shard's fields many times)."""
    return pickle.loads(zlib.decompress(payload))


@dataclass
class AlignOptions:
    beam: float = 10.0
    retry_beam: float = 40.0
    acoustic_scale: float = 0.1
    transition_scale: float = 1.0
    self_loop_scale: float = 0.1


@dataclass
class EStepResult:
    """Statistics of one shard (everything picklable)."""

    occ: np.ndarray
    x: np.ndarray
    x2: np.ndarray
    trans: np.ndarray
    like: float
    frames: int
    alignments: dict[str, Alignment] | Written | None = None  # the shard's new ones (their index once written)
    failed: list[tuple[str, str]] = field(default_factory=list)
    retried: int = 0
    align_like: float = 0.0
    seconds: float = 0.0
    aligned_frames: int = 0  # frames of the new alignments

    def __sizeof__(self) -> int:
        """Its statistics' bytes: what Dask's memory accounting of a worker (``dask.sizeof``) counts for it."""
        return object.__sizeof__(self) + sum(np.asarray(a).nbytes for a in (self.occ, self.x, self.x2, self.trans))


def features(shard: Shard) -> list[np.ndarray]:
    """CMVN (per speaker, or per utterance) then Δ/ΔΔ features of a shard, or its spliced frames through its
    projection, read from the archives on every pass as Kaldi's pipelines do (``apply-cmvn | add-deltas``):
    the operating system's page cache keeps the archives, and reading a shard again costs no measurable time
    next to its E-step, where keeping it in the worker would grow the worker with the corpus."""
    out = []
    for value, spk in zip(shard.feats, shard.speakers):
        mat = apply_cmvn(load(value), None if shard.per_utterance else shard.cmvn[spk])
        if shard.deltas:
            mat = add_deltas(mat, shard.deltas)
        out.append(np.ascontiguousarray(mat if shard.projection is None else shard.projection(mat)))
    return out


def graph_bytes(graph) -> int:
    """About what a compiled graph holds in memory (OpenFst's VectorFst): 16 bytes an arc, 64 a state (the
    state object, its arc vector and the pointer to it) and 256 for the graph; a process's resident memory
    grew by about this much per graph of speechocean762's training transcripts."""
    states = graph.num_states
    return 256 + 64 * states + 16 * sum(graph.num_arcs(s) for s in range(states))


def _compiler(model: GmmModel, lang_dir: str, tree_key: bytes):
    key = (lang_dir, tree_key)
    if key not in _COMPILERS:
        lexicon = kfst.StdVectorFst.read(f"{lang_dir}/L.fst")
        disambig = [int(x) for x in Path(f"{lang_dir}/disambig.int").read_text().split()]
        opts = khg.TrainingGraphCompilerOptions(transition_scale=0.0, self_loop_scale=0.0)
        tm = khg.TransitionModel(ctx_dep=model.tree, hmm_topo=model.topo)
        compiler = khg.TrainingGraphCompiler(trans_model=tm, ctx_dep=model.tree, lex_fst=lexicon,
                                             disambig_syms=disambig, opts=opts)
        _KEEP.extend([model.tree, model.topo, tm, lexicon])  # the compiler holds raw C++ references
        _COMPILERS[key] = compiler
    return _COMPILERS[key]


def tree_key(model: GmmModel) -> bytes:
    """A short identity of the model's tree (graphs depend on the tree, not on the GMMs)."""
    return zlib.crc32(bytes(b & 0xFF for b in model.tree.__getstate__()[0])).to_bytes(4, "little")


def training_graph(model: GmmModel, shard: Shard, i: int, tree_id: bytes):
    """The utterance's training graph (transcript → HMM states), compiled once per worker and transcript:
    utterances with the same words (speed-perturbed copies, prompts read by many speakers) share one. The
    graphs of another lang or tree (a system trained before) are dropped when this one's are first asked for."""
    tree = (shard.lang_dir, tree_id)
    if _GRAPH_TREE and _GRAPH_TREE[0] != tree:
        _GRAPHS.clear()
    _GRAPH_TREE[:] = [tree]
    key = (shard.lang_dir, tree_id, tuple(int(w) for w in shard.word_ids[i]))
    return _GRAPHS.get(key, lambda: _compiler(model, shard.lang_dir, tree_id).compile_graph_from_text(
        list(shard.word_ids[i])), graph_bytes)


def text_graph(model: GmmModel, lang_dir: str, word_ids: list[int], tree_id: bytes):
    """The training graph of any word sequence (e.g. a first-pass hypothesis), not cached."""
    return _compiler(model, lang_dir, tree_id).compile_graph_from_text(list(word_ids))


def equal_alignment(graph, num_frames: int, utt: str) -> np.ndarray | None:
    """``align-equal-compiled``: a random path through the graph of exactly ``num_frames``."""
    ok, path = kfst.equal_align(ifst=graph, length=num_frames, rand_seed=zlib.crc32(utt.encode()) & 0x7FFFFFFF,
                                num_retries=10)
    if not ok:
        return None
    ok, tids, _, _ = kfst.get_linear_symbol_sequence(path)
    return np.asarray(tids, dtype=np.int32) if ok and len(tids) == num_frames else None


def viterbi_alignment(model: GmmModel, graph, feats: np.ndarray, utt: str,
                      opts: AlignOptions) -> tuple[np.ndarray | None, bool, float]:
    """``gmm-align-compiled``: best path with beam, retried at ``retry_beam``; (ali, retried, like)."""
    fst = kfst.StdVectorFst(graph)
    khg.add_transition_probs(trans_model=model.tm, transition_scale=opts.transition_scale,
                             self_loop_scale=opts.self_loop_scale, fst=fst)
    decodable = khg.DecodableAmDiagGmmScaled(am=model.am, tm=model.tm, feats=feats, scale=opts.acoustic_scale)
    cfg = khg.AlignConfig(beam=opts.beam, retry_beam=opts.retry_beam, careful=False)
    done, _, retried, like, _, ali, _ = khg.align_utterance_wrapper(
        config=cfg, utt=utt, acoustic_scale=opts.acoustic_scale, fst=fst, decodable=decodable,
        num_done=0, num_error=0, num_retried=0, tot_like=0.0, frame_count=0)
    if done != 1 or len(ali) != feats.shape[0]:
        return None, bool(retried), 0.0
    return np.asarray(ali, dtype=np.int32), bool(retried), float(like)


def accumulate(model: GmmModel, feats: list[np.ndarray], alignments: list[np.ndarray]) -> tuple:
    """``gmm-acc-stats-ali`` in numpy: Gaussian posteriors within each aligned pdf."""
    offsets = model.gaussian_offsets()
    dim = model.am.dim
    num_gauss = int(offsets[-1])
    occ, sx, sx2 = np.zeros(num_gauss), np.zeros((num_gauss, dim)), np.zeros((num_gauss, dim))
    trans = np.zeros(model.tm.num_transition_ids + 1)
    if not feats:
        return occ, sx, sx2, trans, 0.0, 0
    x_all = np.concatenate(feats)
    tids = np.concatenate(alignments).astype(np.int64)
    trans += np.bincount(tids, minlength=len(trans))
    pdfs = model.tid2pdf[tids]
    order = np.argsort(pdfs, kind="stable")
    bounds = np.searchsorted(pdfs[order], np.arange(model.am.num_pdfs + 1))
    like = 0.0
    for pdf in np.flatnonzero(np.diff(bounds)):
        xp = x_all[order[bounds[pdf]: bounds[pdf + 1]]]
        ll = np.asarray(model.am.get_pdf(int(pdf)).log_likelihoods_matrix(xp), dtype=np.float64)
        top = ll.max(1, keepdims=True)
        post = np.exp(ll - top)
        norm = post.sum(1, keepdims=True)
        like += float((np.log(norm) + top).sum())
        post /= norm
        xd = xp.astype(np.float64)
        g = slice(offsets[pdf], offsets[pdf + 1])
        occ[g] += post.sum(0)
        sx[g] += post.T @ xd
        sx2[g] += post.T @ (xd * xd)
    return occ, sx, sx2, trans, like, int(len(tids))


def archive_name(shard: Shard) -> str:
    """The file name of a shard's alignment archive (one per shard key)."""
    return hashlib.sha1(shard.key.encode()).hexdigest()[:16] + ".ark"


def estep(shard: Shard, model_blob: bytes, alignments: dict[str, Alignment] | None, mode: str,
          opts: AlignOptions, write_to: str | None = None) -> EStepResult:
    """One shard of an iteration. ``mode``: ``equal`` (flat start), ``realign``, ``accumulate``, or ``align``
    (Viterbi alignments only, no statistics: aligning a split with a finished model). ``alignments``: the
    shard's (accumulate), vectors or references; ``write_to``: the folder the new alignments are written to,
    one archive per shard, the result then holding its index (:class:`~asrflow.gmm.alignments.Written`)."""
    start = time.perf_counter()
    model = GmmModel.from_bytes(model_blob)
    tree_id = tree_key(model)
    feats = features(shard)
    kept_feats, kept_ali, failed, new = [], [], [], {}
    retried, align_like = 0, 0.0
    for i, utt in enumerate(shard.utts):
        if mode == "accumulate":
            ali = (alignments or {}).get(utt)
            ali = None if ali is None else load_alignment(ali)
        else:
            graph = training_graph(model, shard, i, tree_id)
            if mode == "equal":
                ali = equal_alignment(graph, feats[i].shape[0], utt)
                if ali is None:
                    failed.append((utt, f"no path of {feats[i].shape[0]} frames through the training graph"))
            else:
                ali, was_retried, like = viterbi_alignment(model, graph, feats[i], utt, opts)
                retried += int(was_retried)
                align_like += like
                if ali is None:
                    failed.append((utt, f"alignment failed with beam {opts.beam} and retry beam {opts.retry_beam}"))
            if ali is not None:
                new[utt] = ali
        if ali is not None and mode != "align":
            kept_feats.append(feats[i])
            kept_ali.append(ali)
    occ, sx, sx2, trans, like, frames = accumulate(model, kept_feats, kept_ali)
    aligned = sum(len(a) for a in new.values())
    if mode != "accumulate" and write_to is not None:
        archive = f"{write_to}/{archive_name(shard)}"
        write_archive(archive, new)
        new = Written((str(archive_index(archive)),))
    return EStepResult(occ, sx, sx2, trans, like, frames, None if mode == "accumulate" else new, failed,
                       retried, align_like, time.perf_counter() - start, aligned)


def moments(shard: Shard) -> tuple[float, np.ndarray, np.ndarray]:
    """Count, sum and sum of squares of a shard's features (for ``gmm-init-mono``)."""
    x = np.concatenate(features(shard)).astype(np.float64)
    return float(len(x)), x.sum(0), (x * x).sum(0)


def tree_stats(shard: Shard, model_blob: bytes, alignments: dict[str, Alignment], factor: int = 1):
    """``acc-tree-stats`` for a shard, from a system's alignments (each frame's phone and HMM state); with
    ``factor`` > 1 at one frame in ``factor``, for a chain tree (:func:`asrflow.gmm.chain.chain_tree_stats`)."""
    from asrflow.gmm.chain import chain_tree_stats
    from asrflow.gmm.tree import TreeStats, accumulate_tree_stats

    model = GmmModel.from_bytes(model_blob)
    phone_of, state_of = model.tid_tables
    parts = []
    for feats, utt in zip(features(shard), shard.utts):
        if utt in alignments:
            ali = load_alignment(alignments[utt])
            if factor == 1:
                parts.append(accumulate_tree_stats(feats, phone_of[ali], state_of[ali]))
            elif (stats := chain_tree_stats(feats, phone_of[ali], state_of[ali], factor)) is not None:
                parts.append(stats)
    return TreeStats.merge(parts) if parts else None
