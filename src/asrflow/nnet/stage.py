"""The nnet stage: train one network of ``nnet.models`` on a training split (every torchrun rank runs this).

Output folder (``results/<exp>/nnet/<train split>/<system>/``)::

    final.pt        weights of the best held-out epoch with their config (``weights_only`` loadable);
                    hybrid models also carry their log priors, CTC models their unit inventory
    priors.npy      log pdf priors (hybrid): from the alignments, or with nnet.priors: posteriors the
                    network's own average posteriors on its training utterances
    units.model     sentencepiece model (CTC over BPE or characters)
    units.txt       the phones, class 1 first (CTC over phones)
    report.tsv      training utterances left out, and why
    manifest.json   objective, classes, parameters, epochs, held-out loss, frames/s, seconds

The full training state (``checkpoint.pt``, ``best.pt``) lives in a separate state folder
that Snakemake does not own, so a failed or killed job resumes when rerun; it is removed
once training has finished.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from asrflow.config import CHAIN, model_alignments, model_cmvn, model_train, settings
from asrflow.config.paths import Paths
from asrflow.config.settings import Parallel, Training
from asrflow.config.sizes import network_config
from asrflow.data.datadir import read_table
from asrflow.data.holdout import held_out_utterances
from asrflow.data.perturb import copy_ids, perturbed_split
from asrflow.gmm.alignments import alignment_index, read_alignments
from asrflow.nnet import NnetError
from asrflow.nnet.data import FeatureDataset
from asrflow.nnet.distill import DistillObjective
from asrflow.nnet.frames import multi_frame_init
from asrflow.nnet.hybrid import pdf_priors, posterior_priors, spread_indices
from asrflow.nnet.inference import load_network
from asrflow.nnet.lowrank import factorised_init
from asrflow.nnet.mmi import MmiObjective, denominator_from_fst, load_denominator_graph
from asrflow.nnet.models import build_model, parameter_count
from asrflow.nnet.prune import packed, pruned_init
from asrflow.nnet.train import atomic_save, train
from asrflow.nnet.units import PhoneUnits, Units
from asrflow.tracking import BackgroundMetrics


@dataclass
class Targets:
    """What a network learns to predict on one training split."""

    labels: dict[str, np.ndarray]
    num_classes: int
    frame_level: bool
    extra: dict[str, Any]  # stored in final.pt (e.g. the unit inventory)


def train_options(config: dict[str, Any], system: str, epochs: int | None = None) -> Training:
    """Network ``system``'s training settings (:func:`asrflow.config.settings.training`).

    With ``epochs`` (the benchmarks): exactly that many epochs, no early stopping and no
    checkpoints but those at the epoch ends.
    """
    opts = settings.training(config, system)
    if epochs is not None:
        opts = opts.replace(epochs=epochs, patience=epochs + 1, checkpoint_every=10 ** 9)
    return opts


def checked_parallel(opts: Parallel) -> Parallel:
    """A network's parallel settings, once its learner count is known to match the processes torchrun started.

    The launch settings (nodes, launcher, port, gpus) are ``asrflow launch``'s, not the learners'.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world != opts.learners:
        raise NnetError(f"nnet.parallel.learners is {opts.learners} but {world} learner process(es) are running; "
                        f"start them with torchrun --nproc-per-node {opts.learners}")
    return opts


def hybrid_targets(gmm_dir: Path, alignments: Path | None = None, priors: bool = True) -> Targets:
    """Tied-state (pdf) ids per frame from the GMM's alignments (or ``alignments``, an align stage folder of
    that GMM), and their log priors; without ``priors`` (the chain tree's networks) zeros."""
    from asrflow.gmm.model import GmmModel

    labels = read_alignments((alignments or gmm_dir) / "ali", "pdfs")
    num_pdfs = GmmModel.load(gmm_dir).am.num_pdfs
    log_priors = pdf_priors(labels, num_pdfs) if priors else np.zeros(num_pdfs)
    return Targets(labels, num_pdfs, True, {"priors": torch.from_numpy(log_priors)})


def ctc_targets(texts: dict[str, str], kind: str, vocab_size: int, lang_dir: str | Path | None = None) -> Targets:
    """Unit sequences of the transcripts: sentencepiece units trained on them, or the lang's phones.

    With phones, a transcript with a word the lexicon cannot spell gets no units (the
    utterance is reported as ``no transcript units``).
    """
    if kind == "phone":
        if lang_dir is None:
            raise NnetError("CTC over phones needs the lang folder (--lang) for its phones and lexicon")
        units = PhoneUnits.from_lang(lang_dir)
        labels = {utt: classes for utt, text in texts.items() if len(classes := units.encode(text)) or not text.split()}
        key = "phones"
    else:
        units = Units.train(texts.values(), kind, vocab_size)
        labels = {utt: units.encode(text) for utt, text in texts.items()}
        key = "units"
    return Targets(labels, units.num_classes, False, {key: torch.frombuffer(bytearray(units.model), dtype=torch.uint8)})


def training_data(config: dict[str, Any], system: str, train_split: str, paths: Paths
                  ) -> tuple[Targets, FeatureDataset, FeatureDataset, dict[str, str]]:
    """Targets, training and held-out sets of network ``system``, and the utterances left out (with why).

    ``paths.gmm`` (its alignments) is needed by hybrids, ``paths.lang`` by CTC over phones. With
    ``speed_perturb`` the network trains on ``<train>_sp`` (a hybrid on the copies' alignments
    in ``paths.alignments``, the align stage's folder); the held-out utterances' copies stay out of
    training, and the held-out set is the unperturbed utterances alone.
    """
    data_dir, feats_dir, gmm_dir, lang_dir, alignments = (paths.data, paths.features, paths.gmm, paths.lang,
                                                          paths.alignments)
    model = config["nnet"]["models"][system]
    if model["type"] == "ensemble":
        raise NnetError(f"{system!r} is an ensemble of trained networks: `asrflow ensemble` assembles it from "
                        f"{', '.join(model['members'])}; it is not trained")
    perturbed = model_train(config, system)["speed_perturb"]
    source = perturbed_split(train_split) if perturbed else train_split
    if perturbed and not (data_dir / source / "text").is_file():
        raise NnetError(f"{system!r} trains with speed_perturb but {data_dir / source} does not exist: "
                        f"set audio.speed_perturb (e.g. [0.9, 1.0, 1.1]) and rerun the data stage")
    texts = read_table(data_dir / source / "text")
    if model["objective"] == "hybrid":
        if gmm_dir is None or not alignment_index(Path(gmm_dir) / "ali", "pdfs").is_file():
            raise NnetError(f"hybrid network {system!r} needs the GMM alignments: --gmm must be a GMM system "
                            f"folder with ali/pdfs.scp (got {gmm_dir})")
        if perturbed and (alignments is None or not alignment_index(Path(alignments) / "ali", "pdfs").is_file()):
            raise NnetError(f"hybrid network {system!r} trains with speed_perturb: --alignments must be the align "
                            f"stage's folder of {source} with ali/pdfs.scp (got {alignments})")
        targets = hybrid_targets(Path(gmm_dir), Path(alignments) if perturbed else None,
                                 priors=model_alignments(config, system) != CHAIN)
    else:
        targets = ctc_targets(texts, model["units"], model["vocab_size"], lang_dir)
    valid_utts = held_out_utterances(config, data_dir, train_split)
    train_utts = set(texts) - valid_utts - copy_ids(valid_utts, config["audio"]["speed_perturb"])
    subsampling = model.get("subsampling", 1)

    def dataset(split: str, keep: set[str]) -> FeatureDataset:
        return FeatureDataset(data_dir, feats_dir, split, targets.labels, targets.frame_level, keep, subsampling,
                              cmvn=model_cmvn(config, system))

    train_set, valid_set = dataset(source, train_utts), dataset(train_split, valid_utts)
    return targets, train_set, valid_set, {**train_set.rejected, **valid_set.rejected}


def mmi_criterion(opts: Training, system: str, gmm_dir: str | Path | None, graph_dir: str | Path | None,
                  log_priors: torch.Tensor, lang_dir: str | Path | None = None,
                  alignments: str | Path | None = None) -> MmiObjective | None:
    """The MMI objective of hybrid ``system`` when ``train.mmi.weight`` > 0 (else None): its
    denominator is the HCLG in ``graph_dir`` of the GMM in ``gmm_dir`` (whose tree numbers the pdfs),
    or with ``denominator: phone_lm`` a phone LM over that GMM's alignments and ``lang_dir``'s phones.
    With ``tolerance`` its numerator sums over the timings near the chain alignments of the training
    utterances (in ``alignments``, an align stage's folder, else ``gmm_dir``)."""
    mmi = opts.mmi
    if not mmi.weight:
        return None
    phone_lm = mmi.denominator == "phone_lm"
    if gmm_dir is None or (lang_dir if phone_lm else graph_dir) is None:
        raise NnetError(f"{system} trains with MMI (train.mmi.weight {mmi.weight}): it needs the GMM (--gmm) "
                        + ("and the lang folder (--lang) for its phone LM" if phone_lm
                           else "and its decoding graph (--graph)"))
    from asrflow.gmm.model import GmmModel

    model = GmmModel.load(gmm_dir)
    if phone_lm:
        from asrflow.nnet.phone_lm import phone_lm_graph  # kaldifst, as load_denominator_graph

        hclg, _ = phone_lm_graph(lang_dir, gmm_dir, model, mmi.phone_lm_order)
        graph = denominator_from_fst(hclg, model.tid2pdf)
    else:
        graph = load_denominator_graph(Path(graph_dir) / "HCLG.fst", model.tid2pdf)
    numerator = None
    if mmi.tolerance:
        from asrflow.nnet.numerator import ChainNumerator

        tids = read_alignments(Path(alignments or gmm_dir) / "ali", "transition_ids")
        numerator = ChainNumerator(tids, model, mmi.tolerance)
    return MmiObjective(graph, log_priors, mmi.weight, mmi.acoustic_scale, mmi.cross_entropy == "separate",
                        numerator)


def with_xent_weights(init: dict[str, Any]) -> dict[str, Any]:
    """``init`` (a ``final.pt`` content) with a cross-entropy output (``output.xent``) that starts as its output
    layer, when it has none, for a network trained with a separate one (``train.mmi.cross_entropy``)."""
    weights = init["model"]
    if "output.xent.weight" in weights or "output.weight" not in weights:
        return init
    return {**init, "model": {**weights, "output.xent.weight": weights["output.weight"].clone(),
                              "output.xent.bias": weights["output.bias"].clone()}}


def without_xent_output(saved: dict[str, Any]) -> dict[str, Any]:
    """A ``final.pt`` content without the cross-entropy output of its training (the network decoding reads)."""
    return {**saved, "config": {k: v for k, v in saved["config"].items() if k != "xent_output"},
            "model": {k: v for k, v in saved["model"].items() if not k.startswith("output.xent.")}}


SHAPE_KEYS = ("ranks", "pruned")  # what a compressed network's final.pt config adds to its sizes


def initial_weights(config: dict[str, Any], system: str, init_dir: str | Path | None) -> dict[str, Any] | None:
    """The ``final.pt`` of the network ``system`` starts from (its ``init``, trained in ``init_dir``), or None
    for a network without one; a missing folder or a network of another shape is an NnetError."""
    source = config["nnet"]["models"][system].get("init")
    if source is None:
        if init_dir is not None:
            raise NnetError(f"--init {init_dir} given, but {system} has no init (set nnet.models.{system}.init to "
                            f"the network it starts from)")
        return None
    path = Path(init_dir or "") / "final.pt"
    if init_dir is None or not path.is_file():
        raise NnetError(f"{system} starts from {source}'s weights (nnet.models.{system}.init): --init must be "
                        f"{source}'s trained network folder with final.pt (got {init_dir})")
    saved = torch.load(path, weights_only=True)
    shape = {k: v for k, v in saved["config"].items() if k not in SHAPE_KEYS}  # a compressed init's layers aside
    mine, theirs = network_config(config["nnet"]["models"][system]), network_config(shape)
    heads = mine.get("multi_frame", 1)
    if theirs.get("multi_frame", 1) == 1 and heads > 1:  # a one-head network: every head starts as its output layer
        saved = {**saved, "model": multi_frame_init(saved["model"], heads),
                 "config": {**saved["config"], "multi_frame": heads}}
        theirs = network_config(saved["config"])
    encoder = config["nnet"]["models"][system].get("init_layers") == "encoder"
    if mine != theirs or (saved["objective"] != config["nnet"]["models"][system]["objective"] and not encoder):
        raise NnetError(f"{path} is a {saved['objective']} {theirs} network, not the shape of {system} "
                        f"({config['nnet']['models'][system]['objective']} {mine}): retrain {source}")
    return without_output(saved) if encoder else saved


def without_output(saved: dict[str, Any]) -> dict[str, Any]:
    """A ``final.pt`` content without its output layer (``output.*``) and its class count: the layers below it,
    which a network with outputs of its own starts from (``init_layers: encoder``)."""
    return {**saved, "num_classes": None,
            "model": {k: v for k, v in saved["model"].items() if not k.startswith("output.")}}


def distill_criterion(net: settings.Network, teacher_dir: Path | None, num_classes: int,
                      input_dim: int) -> DistillObjective:
    """The teacher–student objective of student ``net``, its teacher read from ``teacher_dir/final.pt``."""
    path = Path(teacher_dir or "") / "final.pt"
    if teacher_dir is None or not path.is_file():
        raise NnetError(f"{net.name} learns from {net.teacher['network']} (nnet.models.{net.name}.teacher): --teacher "
                        f"must be its trained network folder with final.pt (got {teacher_dir})")
    teacher, header = load_network(path)
    if (header["num_classes"], header["input_dim"]) != (num_classes, input_dim):
        raise NnetError(f"{path}: the teacher has {header['input_dim']}-dimensional input and {header['num_classes']} "
                        f"outputs, {net.name} {input_dim} and {num_classes}: retrain {net.teacher['network']}")
    return DistillObjective(teacher, net.teacher["weight"], net.teacher["temperature"])


def compressed_init(init: dict[str, Any], model: dict[str, Any], net: settings.Network,
                    log=print) -> tuple[dict[str, Any], dict[str, Any]]:
    """``init`` (the init network's ``final.pt``) made smaller by the network's ``low_rank`` or ``prune``, and
    the network's config with the shape that takes (``ranks`` or ``pruned``), as its ``final.pt`` keeps it."""
    whole = build_model(init["config"], init["input_dim"], init["num_classes"])
    if net.low_rank:
        init, ranks = factorised_init(init, whole, net.low_rank)
        model, how = {**model, "ranks": ranks}, f"factorised by SVD (ranks {', '.join(map(str, ranks.values()))})"
    else:
        init, layers = pruned_init(init, whole, net.prune["fraction"])
        model, how = {**model, "pruned": layers}, f"pruned by {net.prune['fraction']:.0%}"
    smaller = build_model(model, init["input_dim"], init["num_classes"])
    smaller.load_state_dict(init["model"])  # a pruned network's count depends on its masks
    log(f"{net.name}: {len(model.get('ranks') or model['pruned'])} layers of {net.init} {how}: "
        f"{parameter_count(whole):,} → {parameter_count(smaller):,} weights")
    return init, model


def train_system(config: dict[str, Any], system: str, train_split: str, paths: Paths, run: Any,
                 log=print) -> dict[str, Any]:
    """Train network ``system`` on ``train_split``; rank 0 writes the folder described above into ``paths.out``.

    A hybrid reads the GMM's alignments (``paths.gmm``; with MMI also its decoding graph, ``paths.graph``);
    a network with an ``init`` starts from the weights in ``paths.init``; the resumable state lives in
    ``paths.state`` (default ``<out>/state``).
    """
    net = settings.network(config, system)
    out = paths.out
    out.mkdir(parents=True, exist_ok=True)
    state = paths.state or out / "state"
    targets, train_set, valid_set, rejected = training_data(config, system, train_split, paths)
    opts = net.training
    init = initial_weights(config, system, paths.init)
    model = config["nnet"]["models"][system]
    if init is not None and (net.low_rank or net.prune):
        init, model = compressed_init(init, model, net, log)
    elif init is not None:  # a compressed init (a decoding variant of it) keeps its factorised or pruned layers
        model = {**model, **{k: init["config"][k] for k in SHAPE_KEYS if k in init["config"]}}
    criterion = (mmi_criterion(opts, system, paths.gmm, paths.graph, targets.extra["priors"], paths.lang,
                               paths.alignments if opts.speed_perturb else None)
                 if net.objective == "hybrid" else None)
    log(f"{system} ({net.type}, {net.objective}{', + MMI' if criterion else ''}): {len(train_set)} training and "
        f"{len(valid_set)} held-out utterances, {targets.num_classes} classes; {len(rejected)} left out"
        + (f"; MMI denominator ({opts.mmi.denominator}) {criterion.graph.num_states} states, "
           f"{criterion.graph.num_arcs} arcs" if criterion else "")
        + (f"; starting from {net.init}'s {'layers below its output' if net.init_layers == 'encoder' else 'weights'}"
           if init is not None else ""))
    if not len(train_set) or not len(valid_set):
        raise NnetError(f"no usable training or held-out utterances for {system} on {train_split} "
                        f"(see {out / 'report.tsv'})")
    if criterion is not None and opts.mmi.cross_entropy == "separate":
        model, init = {**model, "xent_output": True}, init and with_xent_weights(init)
    if net.teacher:
        criterion = distill_criterion(net, paths.teacher, targets.num_classes, train_set[0][1].shape[1])
        log(f"{system}: taught by {net.teacher['network']} (weight {net.teacher['weight']}, temperature "
            f"{net.teacher['temperature']})")
    (out / "report.tsv").write_text("utterance\treason\n" + "".join(f"{u}\t{r}\n" for u, r in sorted(rejected.items())))
    alignments = net.alignments if net.objective == "hybrid" else None  # the GMM of the targets
    run.log_params({**{f"nnet.effective.{k}": v for k, v in opts.as_dict().items()},
                    "nnet.effective.train_data": train_set.split, "nnet.effective.features": net.features,
                    "nnet.effective.cmvn": net.cmvn, "nnet.effective.alignments": alignments or "none",
                    "nnet.effective.init": net.init or "none", "nnet.effective.init_layers": net.init_layers,
                    "nnet.effective.low_rank": " ".join(f"{k} {v}" for k, v in (net.low_rank or {}).items()) or "none",
                    "nnet.effective.prune": str(net.prune["fraction"]) if net.prune else "none",
                    "nnet.effective.teacher": net.teacher["network"] if net.teacher else "none"})
    # per-step metrics written off the training loop, every 25 steps and with each held-out evaluation
    log_metrics = BackgroundMetrics(run)
    try:
        summary = train(model, opts, train_set, valid_set, targets.num_classes, out, log_metrics=log_metrics,
                        log=log, objective=net.objective, extra=targets.extra, state_dir=state,
                        parallel=checked_parallel(net.parallel), criterion=criterion, init=init)
    finally:
        log_metrics.close()
    manifest = {"system": system, "type": net.type, "objective": net.objective, "train": train_split,
                "train_data": train_set.split,  # <train>_sp with speed perturbation
                "features": net.features, "cmvn": net.cmvn, "alignments": alignments, "init": net.init,
                "init_layers": net.init_layers if net.init else None,
                "low_rank": net.low_rank, "prune": net.prune, "teacher": net.teacher,
                "classes": targets.num_classes, "train_utterances": len(train_set),
                "valid_utterances": len(valid_set), "rejected": len(rejected), **summary}
    if summary["world_size"] == 1 or torch.distributed.get_rank() == 0:
        if model.get("xent_output"):  # decoding reads the first output alone
            saved = torch.load(out / "final.pt", weights_only=True)
            atomic_save(without_xent_output(saved), out / "final.pt")
        if "pruned" in model:  # the kept weights and a bit per weight, not two dense matrices
            saved = torch.load(out / "final.pt", weights_only=True)
            atomic_save({**saved, "model": packed(saved["model"], model["pruned"])}, out / "final.pt")
        if net.objective == "hybrid" and net.priors == "posteriors":
            manifest["priors"] = adjust_priors(out, train_set, targets, net.prior_frames, log=log)
        write_outputs(out, net.objective, targets, manifest)
        shutil.rmtree(state, ignore_errors=True)
    log(f"{system}: {summary['epochs']} epochs, {summary['steps']} steps, held-out loss "
        f"{summary['final_valid_loss']:.4f} ({opts.keep} epoch kept), {summary['frames_per_second']:.0f} frames/s, "
        f"{summary['seconds']:.1f} s")
    return manifest


def adjust_priors(out: Path, dataset: FeatureDataset, targets: Targets, frames: int, log=print) -> dict[str, Any]:
    """Replace a trained hybrid's alignment priors (in ``targets`` and ``out/final.pt``, which keeps them as
    ``alignment_priors``) by its own average posteriors over about ``frames`` frames of ``dataset``
    (:func:`~asrflow.nnet.hybrid.posterior_priors`); returns what the manifest records of them."""
    start = time.perf_counter()
    network, saved = load_network(out / "final.pt")
    chosen = spread_indices([item[3] for item in dataset.items], frames)
    priors, count = posterior_priors(network, (dataset[i][1].numpy() for i in chosen), targets.num_classes)
    aligned = targets.extra["priors"].numpy()
    kl = float(np.sum(np.exp(aligned) * (aligned - priors)))
    saved["alignment_priors"], saved["priors"] = saved["priors"], torch.from_numpy(priors)
    atomic_save(saved, out / "final.pt")
    targets.extra["priors"] = saved["priors"]
    info = {"source": "posteriors", "utterances": len(chosen), "frames": count,
            "kl_from_alignments": round(kl, 4), "seconds": round(time.perf_counter() - start, 3)}
    log(f"priors: the network's average posteriors over {count} frames of {len(chosen)} training utterances "
        f"(KL {info['kl_from_alignments']} nats from the alignments' priors), {info['seconds']} s")
    return info


def write_outputs(out: Path, objective: str, targets: Targets, manifest: dict[str, Any]) -> None:
    """What a trained network's folder holds beside ``final.pt``: its priors or units, and the manifest."""
    if objective == "hybrid":
        np.save(out / "priors.npy", targets.extra["priors"].numpy())
    elif "phones" in targets.extra:
        (out / "units.txt").write_bytes(targets.extra["phones"].numpy().tobytes())
    else:
        (out / "units.model").write_bytes(targets.extra["units"].numpy().tobytes())
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
