"""Helpers the Snakefile calls (kept here so the Snakefile holds rules only, and is testable).

* :func:`setup_workflow` validates the config before the DAG is built and writes the
  resolved config to ``results/<experiment>/config.yaml`` (only when its content changed);
* :func:`stage_fingerprint` gives each rule a param that changes exactly when the config
  sections that stage reads change, so Snakemake reruns that stage and what follows it,
  and nothing upstream;
* :func:`pipeline_started` / :func:`pipeline_finished` open and close the MLflow parent run.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asrflow.config import (
    CHAIN,
    FMLLR_SYSTEMS,
    GMM_SOURCES,
    GMM_SYSTEMS,
    SAT_SOURCES,
    ConfigError,
    feature_gmm,
    model_alignments,
    model_features,
    model_train,
    resolve_config,
    section_fingerprint,
    write_resolved,
)
from asrflow.config.schema import reapply_replaced
from asrflow.data.perturb import perturbed_split

#: Config sections (dotted) each stage reads; ``{kind}`` is the feature kind.
STAGE_SECTIONS: dict[str, tuple[str, ...]] = {
    "data": ("corpus", "audio.min_duration", "audio.max_duration", "audio.speed_perturb"),
    "features": ("audio.sample_rate", "seed", "features.frame_length_ms", "features.frame_shift_ms",
                 "features.dither", "features.preemphasis", "features.remove_dc_offset", "features.window",
                 "features.low_freq", "features.high_freq", "features.snip_edges", "features.shard_utts",
                 "features.compress", "features.{kind}"),
    "lang": ("lang",),
    # the held-out utterances (seed, nnet.valid_fraction, nnet.hold_out; with hold_out groups, the groups)
    "lang_heldout": ("lang", "seed", "nnet.valid_fraction", "nnet.hold_out", "evaluation.groups"),
    # one system's section: adding or changing another system's does not retrain this one
    "gmm": ("seed", "gmm.shard_utts", "gmm.hold_out", "nnet.valid_fraction", "nnet.hold_out", "gmm.{system}"),
    "align": ("gmm.shard_utts", "gmm.{system}"),
    "chain": ("gmm.shard_utts", "nnet.chain"),
    # the first passes decode at fmllr.beam and fmllr.max_active with the decode section's scale and penalty
    "fmllr": ("gmm.shard_utts", "gmm.{system}", "decode.acoustic_scale", "decode.insertion_penalty", "fmllr"),
    "decode": ("decode",),
    "nnet": ("seed", "nnet.features", "nnet.alignments", "nnet.cmvn", "nnet.valid_fraction", "nnet.hold_out",
             "nnet.priors", "nnet.prior_frames", "nnet.parallel", "nnet.train", "nnet.models.{system}"),
    "ensemble": ("nnet.models.{system}",),
    # a network's own decode settings (over nnet.decode) are these two stages', not its training's
    "decode_nnet": ("decode", "nnet.decode", "nnet.models.{system}.objective", "nnet.models.{system}.decode"),
    "tune": ("seed", "decode", "nnet.valid_fraction", "nnet.hold_out", "nnet.decode", "nnet.models.{system}.objective",
             "nnet.models.{system}.decode"),
    "tune_gmm": ("seed", "decode", "decode.tune", "nnet.valid_fraction", "nnet.hold_out", "nnet.decode.shard_utts"),
    "score": ("evaluation.groups",),
}


def parallel_settings(config: dict[str, Any], system: str) -> dict[str, Any]:
    """``nnet.parallel`` overlaid with network ``system``'s own ``parallel`` overrides, as plain values
    (:func:`asrflow.config.settings.parallel`)."""
    from asrflow.config.settings import parallel

    return parallel(config, system).as_dict()


def per_attempt(base: int) -> Callable[..., int]:
    """A rule resource that grows with each retry: ``base`` × attempt (mem_mb, runtime in minutes)."""
    return lambda wildcards, attempt: base * attempt


@dataclass(frozen=True)
class JobCost:
    """What a job needs for the audio it reads: ``mem_mb`` (MB) and ``minutes`` (wall minutes on one thread),
    each ``(base, per hour of audio)``."""

    mem_mb: tuple[float, float]
    minutes: tuple[float, float]


#: Per stage, the job's memory and time as ``base + per_hour × hours``: mem_mb for the whole job (its local Dask
#: workers included), runtime divided by its threads (a network's multiplied by its epochs). Measured on
#: speechocean762 (2.9 h train, 8.7 h train_sp, 2.7 h test; two cores): a job's peak memory is 0.8-1.9 GB
#: (fmllr 3.7 GB), its core-minutes per hour 0.1 (features, align), 2-4 (gmm), 4-8 (fmllr), 13 (decode), 4 a
#: network epoch on CPU; the bases hold start-up and the per-hour rates are about three times the measured.
#: With the 20,000-word LM's graphs, the driver's peak and twice the larger of two workers': tuning 4.9 GB (0.4 +
#: 2 × 2.2; each worker holds the held-out TLG, two penalised copies and the kept scores, at most 1 GiB a worker),
#: the tri's test decode 2.3 GB (0.3 + 2 × 1.0: its HCLG of 5.3 M states in each worker).
JOB_COSTS: dict[str, JobCost] = {
    "features": JobCost(mem_mb=(2000, 10), minutes=(10, 1)),
    "gmm": JobCost(mem_mb=(3000, 20), minutes=(20, 10)),
    "align": JobCost(mem_mb=(2000, 10), minutes=(10, 1)),
    "chain": JobCost(mem_mb=(2000, 10), minutes=(10, 1)),
    "fmllr": JobCost(mem_mb=(4000, 20), minutes=(20, 20)),
    "decode": JobCost(mem_mb=(3000, 10), minutes=(10, 40)),
    "tune": JobCost(mem_mb=(6000, 10), minutes=(30, 20)),
    "nnet": JobCost(mem_mb=(4000, 20), minutes=(30, 12)),
}


def audio_hours(data_dir: str | Path, splits: list[str] | None = None) -> float:
    """Hours of audio in ``splits`` (None: every split) of the data stage's ``manifest.json``.

    Before the data stage has run, the FileNotFoundError names ``data_dir`` itself, the job's input as given:
    Snakemake then leaves the resource to be evaluated once that input exists (a dry run in a new folder
    shows it as to be determined) instead of failing."""
    path = Path(data_dir) / "manifest.json"
    if not path.is_file():
        raise FileNotFoundError(errno.ENOENT, f"no data manifest {path} yet", str(data_dir))
    manifest = json.loads(path.read_text(encoding="utf-8"))["splits"]
    return sum(info["hours"] for name, info in manifest.items() if splits is None or name in splits)


def job_resource(stage: str, kind: str, reads: str = "all", config: dict[str, Any] | None = None) -> Callable[..., int]:
    """A rule's ``mem_mb`` or ``runtime`` (``kind``) from :data:`JOB_COSTS` and the hours of audio the job
    reads, times the attempt (a retry gets twice as much). ``reads``: ``all`` (every split), ``train``
    (``{train}``), ``copies`` (``{train}``'s speed-perturbed copies), ``test`` (``{test}``) or ``network``
    (the split network ``{system}`` of ``config`` trains on, its time times its epochs). Snakemake evaluates
    it once the data stage has written its manifest (before that, :func:`audio_hours` names the missing input)."""
    cost = JOB_COSTS[stage]

    def value(wildcards: Any, input: Any, threads: int, attempt: int) -> int:
        splits = {"all": None, "train": [getattr(wildcards, "train", "")],
                  "copies": [perturbed_split(getattr(wildcards, "train", ""))],
                  "test": [getattr(wildcards, "test", "")]}.get(reads)
        times = 1.0
        if reads == "network":
            train = model_train(config, wildcards.system)
            splits = [perturbed_split(wildcards.train) if train["speed_perturb"] else wildcards.train]
            times = train["epochs"]
        hours = audio_hours(input.data, splits)
        if kind == "mem_mb":
            base, rate = cost.mem_mb
            return math.ceil((base + rate * hours) * attempt)
        base, rate = cost.minutes
        return math.ceil((base + rate * hours * times / max(threads, 1)) * attempt)

    return value


def total_cores(workflow: Any) -> int:
    """The cores Snakemake may use (``--cores``), the jobs' thread counts are cut to.

    Commands that run no job take no ``--cores`` (``--unlock``, which Snakemake itself names after a
    killed run, ``--summary``, ``--cleanup-metadata``); for them this machine's CPUs stand in, so that the
    rules' thread counts still evaluate and those commands work."""
    from snakemake.exceptions import WorkflowError

    try:
        return int(workflow.cores)
    except WorkflowError:
        return os.cpu_count() or 1


def dask_threads(config: dict[str, Any], cores: int) -> int:
    """CPUs a Dask stage's own job needs: for a local cluster its ``dask.workers`` (null: all of ``cores``),
    else one (the scheduler; the workers are Slurm jobs or already running), so its CPUs go to the workers.

    Fewer than all cores lets Snakemake run several small jobs at once (a tiny corpus, whose jobs are
    mostly start-up)."""
    if config["dask"]["cluster"] != "local":
        return 1
    return min(cores, config["dask"]["workers"] or cores)


def nnet_threads(config: dict[str, Any], cores: int) -> int:
    """CPU threads of one network's training job: ``nnet.threads``, null meaning all of ``cores``."""
    return min(cores, config["nnet"]["threads"] or cores)


def launch_resources(config: dict[str, Any], system: str) -> dict[str, Any]:
    """Slurm resources of training ``system`` (snakemake-executor-plugin-slurm names; None: not asked).

    One node: a plain job (``--nodes=1``). Several: the plugin's ``mpi`` mode, one task per node,
    so that ``asrflow launch`` starts one ``torchrun`` per node with ``srun``. With
    ``nnet.parallel.gpus`` each node asks for one GPU per learner on it (``--gres=gpu:N``).
    """
    par = parallel_settings(config, system)
    nodes, per_node = par["nodes"], max(1, par["learners"] // par["nodes"])
    multi = nodes > 1
    return {"nodes": nodes, "tasks": nodes if multi else None, "mpi": "srun" if multi else None,
            "gres": f"gpu:{per_node}" if par["gpus"] else None,
            "tasks_per_gpu": 0 if par["gpus"] else None}  # 0: no --ntasks-per-gpu (one task per node)


def decode_gres(config: dict[str, Any], system: str) -> str | None:
    """Slurm GPUs of decoding or tuning network ``system``: one (``--gres=gpu:1``) when its
    ``nnet.decode.device`` is ``cuda``, none otherwise (``auto`` uses a GPU only where the job lands on one)."""
    from asrflow.config.settings import decoding

    return "gpu:1" if decoding(config, system).device == "cuda" else None


def train_split(test: str, config: dict[str, Any] | None = None) -> str:
    """The training split paired with a test split: ``evaluation.train_of`` when it names one, else by name
    (``test`` → ``train``, ``loso_x_test`` → ``loso_x_train``)."""
    if config is not None and test in config["evaluation"]["train_of"]:
        return config["evaluation"]["train_of"][test]
    if not test.endswith("test"):
        raise ValueError(f"test split {test!r} does not end in 'test'")
    return test[: -len("test")] + "train"


def tests_of(config: dict[str, Any], train: str) -> list[str]:
    """The configured test splits trained on ``train``."""
    return [t for t in config["evaluation"]["test_sets"] if train_split(t, config) == train]


def score_targets(config: dict[str, Any]) -> list[str]:
    """Every score JSON the experiment produces."""
    root = results_dir(config)
    return [f"{root}/score/{system}/{test}.json"
            for system in config["evaluation"]["systems"] for test in config["evaluation"]["test_sets"]]


def network_systems(config: dict[str, Any]) -> list[str]:
    """The evaluated systems that are networks (``nnet.models`` entries)."""
    return [s for s in config["evaluation"]["systems"] if s not in GMM_SYSTEMS + FMLLR_SYSTEMS]


def gmm_inputs(config: dict[str, Any], train: str, system: str) -> dict[str, str]:
    """Inputs of training GMM ``system`` on ``train``: the MFCCs, or for a speaker-adaptively
    trained system the fold's features adapted by its source GMM (rule fmllr); and the system
    whose alignments start it (:data:`~asrflow.config.GMM_SOURCES`)."""
    root = results_dir(config)
    inputs = {"data": f"{root}/data", "features": f"{root}/features/mfcc", "lang": f"{root}/lang/{train}"}
    if system in SAT_SOURCES:
        inputs["features"] = f"{root}/fmllr/{train}/{SAT_SOURCES[system]}"
    if system in GMM_SOURCES:
        inputs["source"] = f"{root}/gmm/{train}/{GMM_SOURCES[system]}"
    return inputs


def align_inputs(config: dict[str, Any], train: str, system: str) -> dict[str, str]:
    """Inputs of aligning ``train``'s speed-perturbed copies with GMM ``system``: its model and the MFCCs, or for a
    speaker-adaptively trained system the copies' features adapted by its source's transforms (rule fmllr)."""
    root = results_dir(config)
    features = f"{root}/fmllr/{train}/{SAT_SOURCES[system]}" if system in SAT_SOURCES else f"{root}/features/mfcc"
    return {"data": f"{root}/data", "features": features, "lang": f"{root}/lang/{train}",
            "gmm": f"{root}/gmm/{train}/{system}"}


def chain_split(config: dict[str, Any], train: str) -> str:
    """The split whose alignments make the chain tree of ``train``: its speed-perturbed copies when a network on the
    tree trains on them (they hold the split's own utterances too), else ``train``."""
    perturbed = any(model_alignments(config, n) == CHAIN and model_train(config, n)["speed_perturb"]
                    for n in trained_networks(config))
    return perturbed_split(train) if perturbed else train


def chain_inputs(config: dict[str, Any], train: str) -> dict[str, str]:
    """Inputs of the chain tree of ``train`` (``nnet.chain``): its source GMM, that GMM's alignments of
    :func:`chain_split` (the align stage's for the copies) and the features it reads them with."""
    root = results_dir(config)
    source = config["nnet"]["chain"]["source"]
    inputs = align_inputs(config, train, source)
    inputs["source"] = inputs.pop("gmm")
    perturbed = chain_split(config, train) != train
    inputs["alignments"] = f"{root}/align/{train}/{source}" if perturbed else inputs["source"]
    return inputs


def gmm_system_inputs(config: dict[str, Any], train: str, system: str) -> dict[str, str]:
    """What GMM ``system`` of ``train`` decodes with: its model and graph, and the MFCCs, or for
    ``<gmm>_fmllr`` the fold's speaker-adapted features (rule fmllr)."""
    root = results_dir(config)
    gmm = system.removesuffix("_fmllr")
    features = f"{root}/fmllr/{train}/{gmm}" if system in FMLLR_SYSTEMS else f"{root}/features/mfcc"
    return {"data": f"{root}/data", "features": features, "lang": f"{root}/lang/{train}",
            "model": f"{root}/gmm/{train}/{gmm}", "graph": f"{root}/graph/{train}/{gmm}"}


def gmm_decode_inputs(config: dict[str, Any], test: str, system: str) -> dict[str, str]:
    """Inputs of decoding ``test`` with GMM ``system`` (:func:`gmm_system_inputs`), and its tuned settings when
    ``decode.tune`` is on."""
    train = train_split(test, config)
    inputs = gmm_system_inputs(config, train, system)
    if config["decode"]["tune"]["enabled"]:
        inputs["tune"] = f"{results_dir(config)}/tune/{train}/{system}"
    return inputs


def gmm_tune_inputs(config: dict[str, Any], train: str, system: str) -> dict[str, str]:
    """Inputs of tuning GMM ``system``'s decoder on the held-out utterances of ``train``: instead of its graph,
    the held-out LM's lang and its HCLG for the system's tree (:func:`heldout_inputs`)."""
    inputs = gmm_system_inputs(config, train, system)
    del inputs["graph"]
    return {**inputs, **heldout_inputs(config, train, system.removesuffix("_fmllr"))}


def heldout_inputs(config: dict[str, Any], train: str, graph: str | None) -> dict[str, str]:
    """What tuning on ``train``'s held-out utterances decodes with: the lang whose LM has not seen them (rule
    lang_heldout) and that lang's graph ``graph``: a GMM's name for the HCLG of its tree (rule graph_heldout),
    ``tlg`` for CTC over phones (rule graph_ctc), None for a search without a graph."""
    root = results_dir(config)
    inputs = {"heldout_lang": f"{root}/lang/{train}_heldout"}
    if graph is not None:
        inputs["heldout_graph"] = f"{root}/graph/{train}_heldout/{graph}"
    return inputs


def needed_networks(config: dict[str, Any]) -> list[str]:
    """Every network the evaluated ones need, themselves first: an ensemble's members, and the networks a
    network starts from (``init``) or learns from (``teacher``), transitively."""
    models = config["nnet"]["models"]
    names: list[str] = []
    todo = list(network_systems(config))
    while todo:
        name = todo.pop(0)
        if name in names:
            continue
        names.append(name)
        model = models[name]
        todo += list(model.get("members", []))
        todo += [model["init"]] if "init" in model else []
        todo += [model["teacher"]["network"]] if "teacher" in model else []
    return names


def ensemble_systems(config: dict[str, Any]) -> list[str]:
    """The ensembles the workflow assembles from trained members: the evaluated ones and any teacher."""
    models = config["nnet"]["models"]
    return [s for s in needed_networks(config) if models[s]["type"] == "ensemble"]


def tuned_networks(config: dict[str, Any]) -> list[str]:
    """The networks whose decoders the tune stage tunes: the evaluated ones."""
    return network_systems(config)


def trained_networks(config: dict[str, Any]) -> list[str]:
    """The networks the nnet rule trains: every needed network that is not an ensemble (:func:`needed_networks`)."""
    models = config["nnet"]["models"]
    return [s for s in needed_networks(config) if models[s]["type"] != "ensemble"]


def decode_nnet_fingerprint(config: dict[str, Any], system: str) -> str:
    """The decode_nnet rule's fingerprint of network ``system``."""
    return stage_fingerprint(config, "decode_nnet", system=system)


def system_pattern(names: list[str] | tuple[str, ...]) -> str:
    """A wildcard constraint matching exactly ``names`` (matching nothing when empty)."""
    return "|".join(re.escape(n) for n in names) or "(?!x)x"


def nnet_inputs(config: dict[str, Any], train: str, system: str) -> dict[str, str]:
    """Inputs of training network ``system`` on ``train``: hybrid models add the GMM and its graph, CTC over phones
    TLG; a fine-tuned network (``init``) the trained network it starts from, a student (``teacher``) its teacher."""
    root = results_dir(config)
    inputs = {"data": f"{root}/data", "features": features_dir(config, train, system), "lang": f"{root}/lang/{train}"}
    model = config["nnet"]["models"][system]
    trained = model["type"] != "ensemble"
    ali = model_alignments(config, system)
    if model["objective"] == "hybrid":
        inputs["gmm"] = f"{root}/gmm/{train}/{ali}"
        if trained and model_train(config, system)["speed_perturb"]:  # the chain tree converts the copies' too
            inputs["alignments"] = inputs["gmm"] if ali == CHAIN else f"{root}/align/{train}/{ali}"
        inputs["graph"] = f"{root}/graph/{train}/{ali}"
    elif model["units"] == "phone":  # decoded through TLG
        inputs["graph"] = f"{root}/graph/{train}/tlg"
    if "init" in model:
        inputs["init"] = f"{root}/nnet/{train}/{model['init']}"
    if "teacher" in model:
        inputs["teacher"] = f"{root}/nnet/{train}/{model['teacher']['network']}"
    return inputs


def features_dir(config: dict[str, Any], train: str, system: str) -> str:
    """The features network ``system`` reads on ``train``: ``features/<kind>``, or for fmllr the
    fold's adapted features, ``fmllr/<train>/<its alignments' GMM>`` (rule fmllr)."""
    kind = model_features(config, system)
    if kind == "fmllr":
        return f"{results_dir(config)}/fmllr/{train}/{feature_gmm(config, system)}"
    return f"{results_dir(config)}/features/{kind}"


def fmllr_inputs(config: dict[str, Any], train: str, system: str) -> dict[str, str]:
    """Inputs of adapting ``train``'s speakers with GMM ``system``: its model and graph; the alignments of the
    speed-perturbed copies when a network trained on them reads this system's fmllr features, or (for the
    source of a speaker-adaptively trained system) needs that system's alignments of the copies; for a
    speaker-adaptively trained system, the transforms of its source system to start from."""
    root = results_dir(config)
    inputs = {"data": f"{root}/data", "features": f"{root}/features/mfcc", "lang": f"{root}/lang/{train}",
              "gmm": f"{root}/gmm/{train}/{system}", "graph": f"{root}/graph/{train}/{system}"}
    if system in SAT_SOURCES:  # its transforms start from those of the system it was trained on
        inputs["init"] = f"{root}/fmllr/{train}/{SAT_SOURCES[system]}"
    perturbed = [n for n in trained_networks(config) if model_train(config, n)["speed_perturb"]]
    reads = any(model_features(config, n) == "fmllr" and feature_gmm(config, n) == system for n in perturbed)
    feeds = any(SAT_SOURCES.get(feature_gmm(config, n)) == system for n in perturbed)
    if reads or feeds:
        inputs["alignments"] = f"{root}/align/{train}/{system}"
    return inputs


def ensemble_inputs(config: dict[str, Any], train: str, system: str) -> dict[str, Any]:
    """Inputs of assembling ensemble ``system`` on ``train``: its members' networks, and what a hybrid is
    decoded with."""
    inputs: dict[str, Any] = nnet_inputs(config, train, system)
    inputs["members"] = [f"{results_dir(config)}/nnet/{train}/{m}" for m in config["nnet"]["models"][system]["members"]]
    return inputs


def network_inputs(config: dict[str, Any], train: str, system: str) -> dict[str, str]:
    """What network ``system`` was trained with on ``train`` (:func:`nnet_inputs`) and the trained network."""
    return {**nnet_inputs(config, train, system), "model": f"{results_dir(config)}/nnet/{train}/{system}"}


def nnet_tune_inputs(config: dict[str, Any], train: str, system: str) -> dict[str, str]:
    """Inputs of tuning network ``system``'s decoder: the network, what it was trained with, and the held-out
    LM's lang with its graph (a hybrid's HCLG for its GMM's tree, TLG for CTC over phones), each built once
    per training split and shared by every network that decodes through it."""
    inputs = network_inputs(config, train, system)
    graph = Path(inputs["graph"]).name if "graph" in inputs else None  # the test graph's: a GMM's name, or tlg
    return {**inputs, **heldout_inputs(config, train, graph)}


def nnet_decode_inputs(config: dict[str, Any], test: str, system: str) -> dict[str, str]:
    """Inputs of decoding ``test`` with network ``system``: the network, what it was trained with, and the
    tuned settings when tuning is on."""
    train = train_split(test, config)
    inputs = network_inputs(config, train, system)
    if config["nnet"]["decode"]["tune"]["enabled"]:
        inputs["tune"] = f"{results_dir(config)}/tune/{train}/{system}"
    return inputs


def optional_args(inputs: Any, *names: str) -> str:
    """``--name path`` for each of ``names`` present in a rule's ``input`` (``heldout_lang``: ``--heldout-lang``)."""
    # Snakemake's InputFiles is a list subclass: `in` would test its paths, not its names
    return " ".join(f"--{n.replace('_', '-')} {inputs[n]}" for n in names if n in inputs.keys())  # noqa: SIM118


def compare_targets(config: dict[str, Any]) -> list[str]:
    """The comparison table and figures (read from MLflow, so only when tracking is on)."""
    if not config["tracking"]["enabled"]:
        return []
    root = results_dir(config)
    return [f"{root}/compare/{name}" for name in ("table.html", "table.md", "table.csv", "wer.png",
                                                  "training_curves.png")]


PARALLEL_STUDY_FILES = ("bench.jsonl", "summary.md", "speedup.png", "accuracy.png", "bytes.png")


def parallel_study_targets(config: dict[str, Any]) -> list[str]:
    """``results/<exp>/parallel/...`` when ``nnet.parallel_study.enabled``."""
    if not config["nnet"]["parallel_study"]["enabled"]:
        return []
    return [f"{results_dir(config)}/parallel/{name}" for name in PARALLEL_STUDY_FILES]


def study_args(config: dict[str, Any]) -> str:
    """``asrflow bench parallel`` options from ``nnet.parallel_study``."""
    study = config["nnet"]["parallel_study"]

    def join(values: list) -> str:
        return ",".join(str(v) for v in values)

    return (f"--system {study['system']} --train train --strategies {join(study['strategies'])}"
            f" --compressions {join(study['compressions'])} --learners {join(study['learners'])}"
            f" --epochs {study['epochs']} --repeats {study['repeats']}"
            f" --simulate-learners {join(study['simulate_learners'])}"
            f" --nodes {study['nodes']} --bandwidth {study['bandwidth']} --latency {study['latency']}"
            f" --emulate-learners {join(study['emulate_learners']) or 'none'}")


def results_dir(config: dict[str, Any]) -> str:
    """``<results_dir>/<experiment>`` (relative to the Snakemake working directory)."""
    return f"{config['results_dir']}/{config['experiment']}"


def setup_workflow(raw: dict[str, Any], overlays: list[str] | tuple[str, ...] = ()) -> tuple[dict[str, Any], str]:
    """Validate ``raw`` (Snakemake's merged config); return it resolved and its written path.

    ``overlays`` are the ``--configfile`` files, whose ``nnet.models`` replace the default's.
    A config error ends Snakemake with the message naming the key, not a traceback.
    """
    try:
        config = resolve_config(reapply_replaced(dict(raw), overlays or ()))
    except ConfigError as exc:
        sys.stderr.write(f"asrflow: error: {exc}\n")
        raise SystemExit(2) from None
    path = f"{results_dir(config)}/config.yaml"
    write_resolved(config, path)
    return config, path


def _lookup(config: dict[str, Any], dotted: str) -> Any:
    node: Any = config
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return node


# Where the learners run, not what they compute: moving a job onto a cluster retrains nothing.
LAUNCH_KEYS = ("nodes", "launcher", "port", "gpus", "backend")
# Settings that change where or how fast a network trains, never what it learns: left out of
# its fingerprint, so changing them retrains nothing.
RUNTIME_KEYS = {"parallel": LAUNCH_KEYS,
                "train": ("prefetch", "checkpoint_minutes", "loader_workers", "log_every", "compile")}

# Parts of a section that only one stage reads, keyed by the section's full key: left out of the
# section's hash elsewhere (decode.tune: the GMM tune stage, "tune_gmm", whose folder the decodes
# then read as an input).
OWN_STAGE_KEYS = {"decode": ("tune",)}


# Settings at a value that changes nothing (nnet.train.seed null: the experiment's seed, which the
# fingerprint already holds; an augmentation or a penalty switched off): left out while at it, so
# adding such settings to the schema reruns nothing. Keyed by the full key of the section when there
# is one ("decode" is the GMMs' section, not nnet.decode), else by its last part ("train": nnet.train
# and every network's own train overrides); "": top-level keys.
NEUTRAL_VALUES: dict[str, dict[str, Any]] = {"train": {"seed": None, "speed_perturb": False, "example_frames": 0,
                                                       "mmi": {"weight": 0.0, "acoustic_scale": 0.1}},
                                             "decode": {"insertion_penalty": 0.0},
                                             "gmm.mono": {"subset": None, "subset_by": "shortest"},
                                             "decode.tune": {"search": "grid", "max_utterances": 2000},
                                             "nnet.decode": {"precision": "float32"},
                                             "corpus": {"extra_training": []},
                                             "lang": {"lexicon_file": None, "stress": "strip", "lm_text": [],
                                                      "lm_arpa": None, "lm_max_ngrams": None, "lm_combine": "pool",
                                                      "lm_weights": None, "lm_vocabulary": None},
                                             "": {"audio.speed_perturb": [], "nnet.cmvn": "speaker",
                                                  "nnet.priors": "alignments", "nnet.prior_frames": 200000,
                                                  "features.compress": False,
                                                  "nnet.hold_out": "utterances", "decode.insertion_penalty": 0.0}}


# Keys added to a nested section after networks were trained with it on: left out of its
# fingerprint while at their defaults, so that adding them reruns nothing.
NEUTRAL_SUBKEYS: dict[str, dict[str, Any]] = {"mmi": {"denominator": "graph", "phone_lm_order": 3,
                                                      "cross_entropy": "shared", "tolerance": 0},
                                              "tune": {"search": "grid", "max_utterances": 2000}}


def _without_new_defaults(key: str, value: Any) -> Any:
    """``value`` (section ``key``) less the :data:`NEUTRAL_SUBKEYS` at their defaults."""
    defaults = NEUTRAL_SUBKEYS.get(key)
    if not defaults or not isinstance(value, dict):
        return value
    return {k: v for k, v in value.items() if not (k in defaults and v == defaults[k])}


def _neutral(section: str, key: str, value: Any) -> bool:
    """Whether ``key`` of ``section`` holds its neutral value; a top-level key absent from an older config
    (None) counts as neutral too."""
    neutral = NEUTRAL_VALUES.get(section, {})
    return key in neutral and (value == neutral[key] or (section == "" and value is None))


def _without_runtime(key: str, value: Any) -> Any:
    section = key.rsplit(".", 1)[-1]
    if (section in RUNTIME_KEYS or key in NEUTRAL_VALUES or key in OWN_STAGE_KEYS) and isinstance(value, dict):
        runtime = RUNTIME_KEYS.get(section, ()) + OWN_STAGE_KEYS.get(key, ())
        neutral = key if key in NEUTRAL_VALUES else section
        value = {k: _without_new_defaults(k, v) for k, v in value.items()}
        return {k: v for k, v in value.items() if k not in runtime and not _neutral(neutral, k, v)}
    if key.startswith("nnet.models.") and isinstance(value, dict):
        out = {k: v for k, v in value.items() if k != "decode"}  # the decode and tune stages' (STAGE_SECTIONS)
        for name in RUNTIME_KEYS:
            if name in out:
                kept = _without_runtime(name, out.pop(name))
                out.update({name: kept} if kept else {})
        return out
    return value


def _absent_override(key: str, config: dict[str, Any]) -> bool:
    """Whether ``key`` is a network's own ``decode`` overrides and the network has none (as before they
    were read): left out of the fingerprint, so that networks without them rerun nothing."""
    return key.startswith("nnet.models.") and key.endswith(".decode") and _lookup(config, key) is None


def _for_decoder(config: dict[str, Any], system: str, key: str, value: Any) -> Any:
    """``value`` of ``nnet.decode`` or of network ``system``'s own ``decode`` overrides, less the settings and
    tuning lists that only other decoder kinds read (a CTC network's lists do not rerun the hybrids' decodes)."""
    if key not in ("nnet.decode", f"nnet.models.{system}.decode") or not isinstance(value, dict):
        return value
    from asrflow.config.settings import decoder_kind, other_kinds_settings

    others = other_kinds_settings(decoder_kind(config["nnet"]["models"][system]))
    out = {k: v for k, v in value.items() if k not in others}
    if isinstance(out.get("tune"), dict):
        tune = {k: v for k, v in out.pop("tune").items() if k not in others}
        out.update({"tune": tune} if tune else {})
    return out


def stage_fingerprint(config: dict[str, Any], stage: str, kind: str = "", system: str = "") -> str:
    """Hash of the config values ``stage`` reads (see :data:`STAGE_SECTIONS`), runtime settings aside; a network's
    decode and tune stages see only its decoder kind's settings (:func:`_for_decoder`)."""
    keys = [k.format(kind=kind, system=system) for k in STAGE_SECTIONS[stage]]
    keys = [k for k in keys if not _neutral("", k, _lookup(config, k)) and not _absent_override(k, config)]
    values = {k: _without_runtime(k, _lookup(config, k)) for k in keys}
    if stage in ("decode_nnet", "tune"):  # own overrides only other kinds read count as none
        values = {k: _for_decoder(config, system, k, v) for k, v in values.items()}
        keys = [k for k in keys if values[k] != {} or k == "nnet.decode"]
    return section_fingerprint(values, *keys)


#: the relay of this Snakemake process's stage journals (:mod:`asrflow.tracking.journal`), while it runs
_RELAY: list[Any] = []


def pipeline_started(config: dict[str, Any]) -> None:
    """Open the MLflow parent run and export its id to every job this Snakemake starts; the jobs journal their
    runs in ``<results>/<experiment>/mlflow-spool``, which a thread of this process relays to MLflow."""
    from asrflow.tracking import PARENT_ENV, start_pipeline_run
    from asrflow.tracking.journal import SPOOL_ENV, Relay

    if os.environ.get(PARENT_ENV):
        return  # a parent run was given from outside (e.g. a wrapper or a test): the stages log to MLflow
    run_id = start_pipeline_run(config, name=f"pipeline-{config['experiment']}")
    if run_id:
        os.environ[PARENT_ENV] = run_id
        spool = Path(results_dir(config)).resolve() / "mlflow-spool"
        os.environ[SPOOL_ENV] = str(spool)
        _RELAY.append(Relay(config, spool, run_id))
        print(f"asrflow: MLflow parent run {run_id}", file=sys.stderr)


def pipeline_finished(config: dict[str, Any], ok: bool) -> None:
    """Relay the stages' journals a last time and close the MLflow parent run opened by :func:`pipeline_started`."""
    from asrflow.tracking import PARENT_ENV, end_pipeline_run

    while _RELAY:
        _RELAY.pop().stop()
    end_pipeline_run(config, os.environ.get(PARENT_ENV), ok)
