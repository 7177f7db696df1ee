"""GMM-HMM training drivers: flat-start monophone (``train_mono.sh``) and triphone with
decision-tree state tying (``train_deltas.sh``; on LDA+MLLT features, ``train_lda_mllt.sh``; on adapted
features, ``train_sat.sh``). E-steps run on Dask; M-steps on the driver.

The driver never holds the alignments themselves: the E-step tasks write them into per-shard archives
in the training's state folder (``ali.<iteration>/``) and hand back where they are
(:mod:`asrflow.gmm.alignments`).
"""

from __future__ import annotations

import operator
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from asrflow.cluster import broadcast, run_reduced, run_sharded
from asrflow.features import Projection, splice
from asrflow.gmm.alignments import Alignment, StoredAlignments, load_alignment, references, shard_alignments
from asrflow.gmm.estep import AlignOptions, Shard, estep, features, moments, tree_stats
from asrflow.gmm.lda import (
    LdaStats,
    MlltStats,
    estimate_lda,
    estimate_mllt,
    lda_stats,
    mllt_objective,
    mllt_stats,
    silence_weights,
    transform_means,
)
from asrflow.gmm.model import GmmModel, init_from_tree, init_mono, read_topology, tree_from_bytes
from asrflow.gmm.resume import GmmState, Progress
from asrflow.gmm.tree import TreeStats, build_tree, context_dependency_bytes, phone_questions
from asrflow.gmm.update import m_step, merge_results, pdf_occupancies, split_gaussians

Metrics = Callable[[int, dict[str, float]], None]
#: Called before each iteration with (iteration, model, alignments); returns the shards to use from then on
#: (their features changed) or None.
BeforeIteration = Callable[[int, GmmModel, dict[str, Alignment]], list[Shard] | None]


@dataclass
class TrainResult:
    model: GmmModel
    alignments: StoredAlignments  # read from the state folder's archives: write them out before state.finish()
    failed: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    iterations: int = 0
    info: dict[str, Any] = field(default_factory=dict)
    projection: Projection | None = None  # LDA+MLLT systems: the features' projection


def _run_iterations(client: Any, shards: list[Shard], progress: Progress, cfg: dict[str, Any], realign: set[int],
                    max_iter_inc: int, retries: int, on_metrics: Metrics, log: Callable[[str], None],
                    state: GmmState, first_beam: float | None = None,
                    before: BeforeIteration | None = None) -> Progress:
    """The EM iterations from ``progress.iteration`` to ``cfg["iterations"]``, saved to ``state`` after each one
    (a realignment's archives in its folder ``ali.<iteration>``).

    ``first_beam``: the alignment beam of iteration 1 (the monophone's first realignment); ``before``: called at
    the start of each iteration (lda: MLLT), may change the shards.
    """
    while progress.iteration < cfg["iterations"]:
        it, model, alignments = progress.iteration, progress.model, progress.alignments
        start = time.perf_counter()
        if before is not None and (changed := before(it, model, alignments)) is not None:
            shards = changed
        mode = "realign" if it in realign else "accumulate"
        beam = first_beam if (first_beam is not None and it == 1) else cfg["beam"]
        opts = AlignOptions(beam=beam, retry_beam=cfg["retry_beam"])
        blob = broadcast(client, model.to_bytes())
        per_shard = [None if mode == "realign" else shard_alignments(alignments, s.utts) for s in shards]
        write_to = str(state.archives(f"ali.{it}")) if mode == "realign" else None
        totals = run_reduced(client, estep_task, list(zip(shards, per_shard)), blob, mode, opts, write_to,
                             combine=merge_results, units=[len(s.utts) for s in shards], desc=f"iter{it}-{mode}",
                             retries=retries)
        if mode == "realign":
            alignments.update(references(totals.alignments or {}))
            for utt, reason in totals.failed:
                alignments.pop(utt, None)
                progress.failed[utt] = reason
        m_step(model, totals, cfg["min_gaussian_occupancy"])
        split_gaussians(model, pdf_occupancies(model, totals), progress.numgauss, progress.rng, cfg["power"])
        if it <= max_iter_inc:
            progress.numgauss += progress.incgauss
        progress.iteration += 1
        state.save(progress)
        seconds = time.perf_counter() - start
        metrics = {"loglike_per_frame": totals.like / max(totals.frames, 1), "frames": totals.frames,
                   "gaussians": model.am.num_gauss, "pdfs": model.am.num_pdfs, "seconds": seconds,
                   "align_failed": len(totals.failed) if mode == "realign" else 0,
                   "align_retried": totals.retried}
        on_metrics(it, metrics)
        log(f"iter {it:2d} {mode:10s} like/frame {metrics['loglike_per_frame']:.4f} "
            f"gauss {metrics['gaussians']:5d} {seconds:.2f}s")
    return progress


def _start(model: GmmModel, target: int, max_iter_inc: int, seed: int) -> Progress:
    """The progress of a system about to run iteration 1 from ``model``: its Gaussians grow evenly to
    ``target`` by iteration ``max_iter_inc``."""
    numgauss = model.am.num_gauss
    return Progress(1, model, {}, numgauss, max(0, (target - numgauss) // max(1, max_iter_inc)),
                    np.random.default_rng(seed))


def _resumed(state: GmmState, begin: Callable[[], Progress]) -> Progress:
    """``state``'s saved progress, or ``begin()``'s (saved at once, so a failure after it does not redo it)."""
    progress = state.load()
    if progress is None:
        progress = begin()
        state.save(progress)
    return progress


def _result(progress: Progress, start: float, cfg: dict[str, Any], info: dict | None = None,
            projection: Projection | None = None) -> TrainResult:
    """The trained system: failures are the utterances that ended without an alignment."""
    return TrainResult(progress.model, StoredAlignments(progress.alignments),
                       {u: r for u, r in progress.failed.items() if u not in progress.alignments},
                       time.perf_counter() - start, cfg["iterations"], info or {}, projection)


def estep_task(item: tuple[Shard, dict | None], blob: bytes, mode: str, opts: AlignOptions,
               write_to: str | None = None):
    """:func:`asrflow.gmm.estep.estep` of one (shard, its alignments) item (the Dask task)."""
    shard, alignments = item
    return estep(shard, blob, alignments, mode, opts, write_to)


def train_mono(config: dict[str, Any], shards: list[Shard], lang_dir: str | Path, client: Any,
               on_metrics: Metrics, log: Callable[[str], None] = print, state: GmmState | None = None) -> TrainResult:
    """Flat-start monophone training (Kaldi ``train_mono.sh``); from ``state``'s saved progress if it has one
    (without one, in a temporary folder of this machine's: local workers only)."""
    start = time.perf_counter()
    cfg = config["gmm"]["mono"]
    retries = config["dask"]["retries"]
    state = state or GmmState(None, "", log)
    progress = _resumed(state, lambda: _equal_pass(config, shards, lang_dir, client, on_metrics, log, state))
    progress = _run_iterations(client, shards, progress, cfg, set(cfg["realign_iterations"]), cfg["max_iter_inc"],
                               retries, on_metrics, log, state, first_beam=cfg["initial_beam"])
    return _result(progress, start, cfg)


def _equal_pass(config: dict[str, Any], shards: list[Shard], lang_dir: str | Path, client: Any,
                on_metrics: Metrics, log: Callable[[str], None], state: GmmState) -> Progress:
    """The monophone from the features' global mean and variance, estimated once from equal alignments
    (iteration 0)."""
    start = time.perf_counter()
    cfg = config["gmm"]["mono"]
    retries = config["dask"]["retries"]
    count, total, squares = run_reduced(client, moments, shards, combine=_add_moments, desc="moments",
                                        retries=retries)
    mean = total / count
    var = np.maximum(squares / count - mean**2, 1e-3)
    model = init_mono(read_topology(Path(lang_dir) / "topo"), mean, var)
    log(f"mono: {model.am.num_pdfs} pdfs, {len(shards)} shards, {sum(len(s.utts) for s in shards)} utterances")
    progress = _start(model, cfg["gaussians"], cfg["max_iter_inc"], config["seed"])
    # Pass 0: equal alignment, then estimate (gmm-est --min-gaussian-occupancy=3).
    blob = broadcast(client, model.to_bytes())
    totals = run_reduced(client, estep_task, [(s, None) for s in shards], blob, "equal", AlignOptions(),
                         str(state.archives("ali.0")), combine=merge_results, units=[len(s.utts) for s in shards],
                         desc="iter0-equal", retries=retries)
    progress.alignments.update(references(totals.alignments or {}))
    progress.failed.update(totals.failed)
    m_step(model, totals, min_gaussian_occupancy=3.0)
    on_metrics(0, {"loglike_per_frame": totals.like / max(totals.frames, 1), "frames": totals.frames,
                   "gaussians": model.am.num_gauss, "pdfs": model.am.num_pdfs,
                   "seconds": time.perf_counter() - start, "align_failed": len(progress.failed), "align_retried": 0})
    return progress


def align_shards(client: Any, shards: list[Shard], model: GmmModel, opts: AlignOptions, retries: int,
                 desc: str, folder: str | Path) -> tuple[dict[str, str], dict[str, str], list]:
    """Force-align every utterance of ``shards`` with ``model`` (``gmm-align-compiled``) into archives in
    ``folder``: where each alignment is, the utterances that failed with why, and the per-shard E-step
    results."""
    blob = broadcast(client, model.to_bytes())
    results = run_sharded(client, estep_task, [(s, None) for s in shards], blob, "align", opts, str(folder),
                          units=[len(s.utts) for s in shards], desc=desc, retries=retries)
    alignments = {u: a for r in results for u, a in references(r.alignments).items()}
    failed = {u: reason for r in results for u, reason in r.failed}
    return alignments, failed, results


def train_tri(config: dict[str, Any], shards: list[Shard], lang_dir: str | Path, source: GmmModel,
              source_alignments: Mapping[str, np.ndarray], client: Any, on_metrics: Metrics,
              log: Callable[[str], None] = print, system: str = "tri", state: GmmState | None = None) -> TrainResult:
    """Triphone training with a decision tree built from another system's alignments, on the
    shards' features: ``tri`` on Δ+ΔΔ MFCCs from the monophone's (``train_deltas.sh``), ``sat``
    on the LDA+MLLT system's fMLLR-adapted features from its alignments (``train_sat.sh`` with the
    transforms fixed). ``config["gmm"][system]`` holds the sizes and iterations; ``state``: where its progress
    is saved after each iteration and resumed from."""
    start = time.perf_counter()
    cfg = config["gmm"][system]
    state = state or GmmState(None, "", log)

    def begin() -> Progress:
        model, info = tree_model(config, cfg, shards, lang_dir, source, source_alignments, client, log, system)
        progress = _start(model, cfg["gaussians"], cfg["max_iter_inc"], config["seed"] + 1)
        progress.extra["info"] = info
        return progress

    progress = _resumed(state, begin)
    # No convert-ali: the first pass aligns with the tree-initialised model (graphs of the new tree).
    progress = _run_iterations(client, shards, progress, cfg, {1, *cfg["realign_iterations"]}, cfg["max_iter_inc"],
                               config["dask"]["retries"], on_metrics, log, state)
    return _result(progress, start, cfg, progress.extra["info"])


def train_lda(config: dict[str, Any], make_shards: Callable[[Projection | None], list[Shard]], lang_dir: str | Path,
              source: GmmModel, source_alignments: Mapping[str, np.ndarray], client: Any, on_metrics: Metrics,
              log: Callable[[str], None] = print, state: GmmState | None = None) -> TrainResult:
    """Triphones on LDA+MLLT features (``train_lda_mllt.sh``), from the tri system's alignments.

    ``make_shards(projection)``: the training split's shards with CMVN-normalised static features
    (None) or their spliced frames through ``projection``. The LDA classes are the source's pdfs,
    silence frames left out; MLLT is re-estimated at ``gmm.lda.mllt_iterations``, moving the model's
    means and composed onto the projection (the result's ``projection``). ``state``: as :func:`train_tri`'s.
    """
    start = time.perf_counter()
    cfg = config["gmm"]["lda"]
    retries = config["dask"]["retries"]
    state = state or GmmState(None, "", log)
    silence = {int(x) for x in (Path(lang_dir) / "silence.int").read_text().split()}

    def begin() -> Progress:
        blob = broadcast(client, source.to_bytes())
        plain = make_shards(None)
        per_shard = [shard_alignments(source_alignments, s.utts) for s in plain]
        stats = run_reduced(client, _lda_stats_task, list(zip(plain, per_shard)), blob, cfg["splice"], silence,
                            combine=operator.add, units=[len(s.utts) for s in plain], desc="lda-stats",
                            retries=retries)
        projection = Projection(cfg["splice"], estimate_lda(stats, cfg["dim"]))
        log(f"lda: {stats.sums.shape[1]} spliced dims -> {cfg['dim']} from {int(stats.count.sum())} non-silence "
            f"frames of {int((stats.count > 0).sum())} pdfs")
        model, info = tree_model(config, cfg, make_shards(projection), lang_dir, source, source_alignments, client,
                                  log, "lda")
        progress = _start(model, cfg["gaussians"], cfg["max_iter_inc"], config["seed"] + 1)
        progress.extra.update(info=info, projection=projection, gains=[])
        return progress

    progress = _resumed(state, begin)
    extra = progress.extra
    shards = make_shards(extra["projection"])  # through the projection reached so far

    def before(it: int, model: GmmModel, alignments: dict[str, Alignment]) -> list[Shard] | None:
        nonlocal shards
        if it not in cfg["mllt_iterations"] or not alignments:
            return None
        blob = broadcast(client, model.to_bytes())
        per_shard = [shard_alignments(alignments, s.utts) for s in shards]
        mllt = run_reduced(client, _mllt_stats_task, list(zip(shards, per_shard)), blob, silence,
                           combine=operator.add, units=[len(s.utts) for s in shards], desc=f"iter{it}-mllt",
                           retries=retries)
        a = estimate_mllt(mllt)
        extra["gains"].append(round(mllt_objective(mllt, a) - mllt_objective(mllt, np.eye(len(a))), 4))
        transform_means(model, a)
        extra["projection"] = Projection(extra["projection"].context, a @ extra["projection"].matrix)
        log(f"iter {it:2d} mllt       objective gain {extra['gains'][-1]:.4f}/frame over {mllt.beta:.0f} frames")
        shards = make_shards(extra["projection"])
        return shards

    progress = _run_iterations(client, shards, progress, cfg,
                               {1, *cfg["realign_iterations"]}, cfg["max_iter_inc"], retries, on_metrics, log, state,
                               before=before)
    info = {**extra["info"], "lda_dim": cfg["dim"], "splice": cfg["splice"], "mllt_gain_per_frame": extra["gains"]}
    return _result(progress, start, cfg, info, extra["projection"])


def tree_model(config: dict[str, Any], cfg: dict[str, Any], shards: list[Shard], lang_dir: str | Path,
                source: GmmModel, source_alignments: Mapping[str, np.ndarray], client: Any,
                log: Callable[[str], None], system: str) -> tuple[GmmModel, dict[str, Any]]:
    """A decision tree from the source system's alignments over the shards' features, and the model it starts
    (one Gaussian per leaf); with its description for the manifest."""
    retries = config["dask"]["retries"]
    blob = broadcast(client, source.to_bytes())
    per_shard = [shard_alignments(source_alignments, s.utts) for s in shards]
    stats = run_reduced(client, _tree_stats_args, list(zip(shards, per_shard)), blob, combine=_merge_tree_stats,
                        desc="tree-stats", retries=retries)
    if stats is None:
        raise ValueError(f"{system}: no aligned frames to build a tree from")
    return tree_from_stats(stats, lang_dir, source.topo, cfg, log, system)


def tree_from_stats(stats: TreeStats, lang_dir: str | Path, topo: Any, cfg: dict[str, Any],
                    log: Callable[[str], None], system: str) -> tuple[GmmModel, dict[str, Any]]:
    """``build-tree`` for the lang's phones on ``stats`` (``cfg``: ``leaves``, ``tree_thresh``,
    ``min_leaf_count``), with questions from ``cluster-phones``, and the model it starts under ``topo``
    (one Gaussian per leaf); with its description for the manifest."""
    lang_dir = Path(lang_dir)
    silence = [int(x) for x in (lang_dir / "silence.int").read_text().split()]
    nonsilence = [int(x) for x in (lang_dir / "nonsilence.int").read_text().split()]
    phones = sorted(silence + nonsilence)
    questions = phone_questions(stats, phones, extra=[silence, nonsilence])
    max_classes = max(n for n in topo.get_phone_to_num_pdf_classes() if n > 0)
    result = build_tree(stats, [[p] for p in phones], max(phones) + 1, questions, max_classes,
                        max_leaves=cfg["leaves"], thresh=cfg["tree_thresh"], min_leaf_count=cfg["min_leaf_count"])
    tree = tree_from_bytes(context_dependency_bytes(result.root))
    model = init_from_tree(topo, tree, result.pdf_count, result.pdf_sum, result.pdf_sumsq)
    log(f"{system}: tree with {result.num_pdfs} leaves ({result.splits} splits, likelihood gain "
        f"{result.objf_gain / max(stats.count.sum(), 1):.3f}/frame), {len(questions)} questions")
    return model, {"leaves": result.num_pdfs, "questions": len(questions), "tree_splits": result.splits}


def _aligned_frames(shard: Shard, model: GmmModel, alignments: dict[str, Alignment],
                    silence: set[int]) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray]]:
    """The shard's aligned utterances: their features, each frame's pdf and its weight (0 on silence)."""
    feats, pdfs, weights = [], [], []
    for x, utt in zip(features(shard), shard.utts):
        ali = load_alignment(alignments[utt]) if utt in alignments else None
        if ali is not None and len(ali) == len(x):
            feats.append(x)
            pdfs.append(model.tid2pdf[ali])
            weights.append(silence_weights(model, ali, silence))
    return feats, pdfs, weights


def _lda_stats_task(item: tuple[Shard, dict], blob: bytes, context: int, silence: set[int]) -> LdaStats:
    """``acc-lda`` of a shard: its spliced frames labelled with the source system's aligned pdfs."""
    shard, alignments = item
    model = GmmModel.from_bytes(blob)
    feats, pdfs, weights = _aligned_frames(shard, model, alignments, silence)
    if not feats:
        dim = (2 * context + 1) * features(shard)[0].shape[1] if shard.utts else 0
        return LdaStats.zeros(model.am.num_pdfs, dim)
    return lda_stats([splice(x, context) for x in feats], pdfs, model.am.num_pdfs, weights)


def _mllt_stats_task(item: tuple[Shard, dict], blob: bytes, silence: set[int]) -> MlltStats:
    """``gmm-acc-mllt`` of a shard under the model being trained, from its current alignments."""
    shard, alignments = item
    model = GmmModel.from_bytes(blob)
    return mllt_stats(model, *_aligned_frames(shard, model, alignments, silence))


def _tree_stats_args(item: tuple[Shard, dict], blob: bytes, factor: int = 1):
    shard, alignments = item
    return tree_stats(shard, blob, alignments, factor)


def _add_moments(a: tuple[float, np.ndarray, np.ndarray],
                 b: tuple[float, np.ndarray, np.ndarray]) -> tuple[float, np.ndarray, np.ndarray]:
    """Two shards' feature count, sum and sum of squares added (a :func:`run_reduced` combination)."""
    return a[0] + b[0], a[1] + b[1], a[2] + b[2]


def _merge_tree_stats(a: TreeStats | None, b: TreeStats | None) -> TreeStats | None:
    """Two shards' tree statistics merged; a shard without aligned frames has None."""
    parts = [p for p in (a, b) if p is not None]
    return TreeStats.merge(parts) if parts else None
