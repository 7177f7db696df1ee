"""Typed, frozen views of the resolved configuration: what the stages take instead of nested dicts.

The schema (``workflow/schemas/config.schema.yaml``) stays the one source of defaults and
validation: these classes have no defaults of their own. :func:`training`, :func:`parallel`,
:func:`network` and :func:`decoding` turn a resolved config into them once;
``<Class>.defaults(**changes)`` builds one from the schema's defaults (library callers and tests).
A unit test keeps every class's fields equal to its schema section's keys.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from functools import cache
from typing import Any, ClassVar, TypeVar

from asrflow.config.schema import (
    CHAIN,
    ConfigError,
    _fill_defaults,
    _load_schema,
    model_alignments,
    model_cmvn,
    model_features,
    model_train,
)
from asrflow.config.sizes import network_config
from asrflow.parallel import ParallelError, overlap_conflict, staleness

T = TypeVar("T", bound="Settings")

#: parallel strategies, and those in which each learner's minibatch is one update of the shared model
STRATEGY_NAMES = ("allreduce", "ring", "kavg", "adpsgd", "hierarchical", "asgd", "pipeline")
SEQUENTIAL = ("ring", "asgd")


@cache
def schema_defaults(path: str) -> dict[str, Any]:
    """The schema's defaults of the object at ``path``: ``$defs/<name>`` or a dotted key (``nnet.parallel``)."""
    schema = _load_schema()
    parts = path.split(".")
    node = schema["$defs"][parts.pop(0).removeprefix("$defs/")] if path.startswith("$defs/") else schema
    for part in parts:
        node = node["properties"][part]
    instance: dict[str, Any] = {}
    _fill_defaults(instance, node, schema)
    return instance


class Settings:
    """Shared constructors of the frozen settings classes."""

    SCHEMA: ClassVar[str]  # where the class's keys and defaults are in the schema
    NESTED: ClassVar[dict[str, type]] = {}  # keys that hold a nested settings object

    @classmethod
    def from_dict(cls: type[T], values: dict[str, Any]) -> T:
        """The settings of a complete (resolved) section; unknown keys are an error."""
        names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
        unknown = sorted(set(values) - names)
        if unknown:
            raise ConfigError(f"{cls.SCHEMA}: unknown settings {', '.join(unknown)}")
        nested = {k: cls.NESTED[k].from_dict(v) if isinstance(v, dict) else v
                  for k, v in values.items() if k in cls.NESTED}
        return cls(**{**values, **nested})

    @classmethod
    def defaults(cls: type[T], **changes: Any) -> T:
        """The schema's defaults with ``changes`` (a nested section given as a dict changes only its keys)."""
        values = dict(schema_defaults(cls.SCHEMA))
        for key, value in changes.items():
            values[key] = {**values[key], **value} if key in cls.NESTED and isinstance(value, dict) else value
        return cls.from_dict(values)

    def replace(self: T, **changes: Any) -> T:
        """A copy with ``changes``."""
        return dataclasses.replace(self, **changes)  # type: ignore[type-var]

    def as_dict(self) -> dict[str, Any]:
        """Plain values, nested sections as dicts (for logging and manifests)."""
        return dataclasses.asdict(self)  # type: ignore[call-overload]


@dataclass(frozen=True)
class SpecAugment(Settings):
    """``nnet.train.specaugment``: masking and warping of training batches (0 masks, 0 warp: off)."""

    SCHEMA: ClassVar[str] = "$defs/nnet_train.specaugment"
    freq_masks: int
    freq_width: int
    time_masks: int
    time_width: int
    freq_warp: float

    @property
    def enabled(self) -> bool:
        return bool(self.freq_masks or self.time_masks or self.freq_warp)


@dataclass(frozen=True)
class Mmi(Settings):
    """``nnet.train.mmi``: the lattice-free MMI term of hybrid training (weight 0: off)."""

    SCHEMA: ClassVar[str] = "$defs/nnet_train.mmi"
    weight: float
    acoustic_scale: float
    denominator: str
    phone_lm_order: int
    cross_entropy: str
    tolerance: int


@dataclass(frozen=True)
class Training(Settings):
    """``nnet.train`` overlaid with a network's own ``train`` overrides; ``seed`` resolved to a number."""

    SCHEMA: ClassVar[str] = "$defs/nnet_train"
    NESTED: ClassVar[dict[str, type]] = {"specaugment": SpecAugment, "mmi": Mmi}
    epochs: int
    max_frames: int
    lr: float
    schedule: str
    warmup_steps: int
    final_lr_factor: float
    newbob_threshold: float
    newbob_factor: float
    weight_decay: float
    clip: float
    checkpoint_every: int
    checkpoint_minutes: float
    patience: int
    keep: str
    amp: bool
    prefetch: int
    loader_workers: int
    log_every: int
    compile: bool
    seed: int | None
    deterministic: bool
    speed_perturb: bool
    chunk_frames: int
    example_frames: int
    specaugment: SpecAugment
    mmi: Mmi

    @classmethod
    def defaults(cls, **changes: Any) -> Training:
        """The schema's defaults with ``changes``; the seed is 0 (the experiment's default) unless given."""
        return super().defaults(**{"seed": 0, **changes})


@dataclass(frozen=True)
class Parallel(Settings):
    """``nnet.parallel`` overlaid with a network's own ``parallel`` overrides: strategy, learners, their knobs
    and where they are launched."""

    SCHEMA: ClassVar[str] = "nnet.parallel"
    strategy: str
    learners: int  # with ``stages`` set, resolved to it
    stages: int | None  # pipeline: stages, one learner each (None: one per learner)
    nodes: int
    launcher: str
    port: int | None
    gpus: bool
    backend: str  # auto: NCCL on GPUs (one per learner), gloo on CPU; gloo: gloo everywhere, GPUs shared
    k: int  # kavg: local steps between model averages
    adapt: bool  # kavg: K / sqrt(learners) steps and lr * sqrt(learners)
    overlap: bool  # kavg: each average travels while the next local step computes, merged after it
    group_size: int  # hierarchical: learners per synchronous group (one node)
    compression: str  # none | 1bit | 8bit (allreduce, ring, kavg)
    timeout: float  # seconds any wait on another learner may take before the job fails
    batch: str  # global: max_frames is one update's batch, split over the learners; learner: each reads it
    stale_lr: str  # ring/asgd with batch global: lr / sqrt(P) (sqrt), lr / P (linear); pipeline: by stage; none
    predict_weights: bool  # pipeline: forward on the weights extrapolated by the last update times the staleness

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGY_NAMES:
            raise ParallelError(f"unknown parallel strategy {self.strategy!r}; known: {', '.join(STRATEGY_NAMES)}")
        if self.batch not in ("global", "learner"):
            raise ParallelError(f"nnet.parallel.batch must be global or learner, not {self.batch!r}")
        if self.stages is not None:
            if self.strategy != "pipeline":
                raise ParallelError(f"nnet.parallel.stages is for the pipeline strategy, not {self.strategy}; "
                                    "set learners instead")
            if self.learners not in (1, self.stages):
                raise ParallelError(f"nnet.parallel.stages is {self.stages} but learners is {self.learners}: a "
                                    "pipeline runs one learner per stage (leave learners out or make it equal)")
            object.__setattr__(self, "learners", self.stages)
        if self.overlap and (problem := overlap_conflict(self.strategy, self.compression)):
            raise ParallelError(f"nnet.parallel.{problem}")

    def learner_frames(self, max_frames: int, world: int) -> int:
        """Frames in one learner's minibatch: ``max_frames`` split over the learners (``batch: global``)
        or ``max_frames`` each (``batch: learner``).

        With ``global`` an epoch holds as many minibatches as with one learner, so every
        strategy makes about as many updates per epoch as single-learner training: the
        strategies that combine the learners' gradients or models each step (allreduce, kavg,
        adpsgd, hierarchical) update with the whole ``max_frames``; ring and asgd make one
        update per learner minibatch, each ``1/P`` as large (see :meth:`lr_factor`).
        """
        if world == 1 or self.batch == "learner" or self.strategy == "pipeline":  # a pipeline's stages share batches
            return max_frames
        return max(1, max_frames // world)

    def lr_factor(self, world: int, rank: int = 0) -> float:
        """Learning-rate factor of learner ``rank`` for stale updates, else 1.

        Ring and asgd with ``batch: global`` update with ``1/P`` of the batch: ``stale_lr: sqrt`` gives
        ``1/sqrt(P)`` (Adam's square-root scaling rule for a smaller batch), ``linear`` ``1/P``, which also
        damps the staleness of their updates (a gradient is ``P - 1`` updates old when it is applied).
        A pipeline's stage ``rank`` applies gradients ``d = 2 (P - 1 - rank)`` updates old: ``1/sqrt(1 + d)``
        or ``1/(1 + d)`` (the last stage's are fresh). ``none``: 1 everywhere.
        """
        if world == 1 or self.stale_lr == "none":
            return 1.0
        if self.strategy == "pipeline":
            stale = 1 + staleness(world, rank)
        elif self.batch == "global" and self.strategy in SEQUENTIAL:
            stale = world
        else:
            return 1.0
        return 1.0 / (stale if self.stale_lr == "linear" else math.sqrt(stale))

    def schedule_ticks(self, world: int, server: bool = False) -> float:
        """Scheduler steps per ``max_frames`` of data read by all learners together.

        With ``batch: global`` a learner step reads ``max_frames / P`` and the P learners
        together read ``max_frames``: one tick per learner step, as one learner would. The
        ASGD server (``server``) applies all P shares: P ticks. With ``batch: learner`` every
        learner reads ``max_frames``: a learner step is P steps of data (1/P ticks), and each
        gradient the server applies is one.
        """
        if world == 1 or self.strategy == "pipeline":
            return 1.0
        if server:
            return float(world) if self.batch == "global" else 1.0
        return 1.0 if self.batch == "global" else 1.0 / world


@dataclass(frozen=True)
class Tuning(Settings):
    """``nnet.decode.tune``: the decoder settings tried on the held-out utterances."""

    SCHEMA: ClassVar[str] = "nnet.decode.tune"
    enabled: bool
    acoustic_scale: list[float]
    tlg_acoustic_scale: list[float]
    insertion_penalty: list[float]
    tlg_insertion_penalty: list[float]
    lm_weight: list[float]
    word_bonus: list[float]
    search: str
    max_utterances: int | None


@dataclass(frozen=True)
class Decoding(Settings):
    """``nnet.decode``: how networks are searched (HCLG, TLG or prefix beam search) and tuned."""

    SCHEMA: ClassVar[str] = "nnet.decode"
    NESTED: ClassVar[dict[str, type]] = {"tune": Tuning}
    acoustic_scale: float
    tlg_acoustic_scale: float
    insertion_penalty: float
    tlg_insertion_penalty: float
    graph_beam: float | None
    max_active: int | None
    beam: int
    lm_weight: float
    word_bonus: float
    prune: float
    vocabulary: str
    shard_utts: int
    frame_skip: int
    batch_frames: int
    device: str
    precision: str
    tune: Tuning

    @classmethod
    def from_saved(cls, values: dict[str, Any]) -> Decoding:
        """The settings a saved model (an MLflow pyfunc bundle's ``settings.json``) decodes with: keys it lacks
        take the schema's defaults (a TLG's insertion penalty: the hybrids', as before it had its own), keys no
        longer known are left out."""
        names = {f.name for f in dataclasses.fields(cls)}
        base = schema_defaults(cls.SCHEMA)
        merged = {**base, **{k: v for k, v in values.items() if k in names}}
        if "tlg_insertion_penalty" not in values and "insertion_penalty" in values:
            merged["tlg_insertion_penalty"] = values["insertion_penalty"]
        tuning = {f.name for f in dataclasses.fields(Tuning)}
        merged["tune"] = {**base["tune"], **{k: v for k, v in dict(merged["tune"]).items() if k in tuning}}
        return cls.from_dict(merged)


@dataclass(frozen=True)
class Network:
    """One network of ``nnet.models``, resolved: its shape and what it reads, trains on and how."""

    name: str
    type: str  # dnn | lstm | cnn | ensemble
    objective: str  # hybrid | ctc
    units: str  # ctc: bpe | char | phone
    vocab_size: int
    features: str  # the feature kind it reads (its own, else nnet.features)
    alignments: str  # the GMM system of its targets, tree and graph (hybrid)
    cmvn: str  # speaker | utterance
    priors: str  # hybrid: alignments | posteriors (nnet.priors), over prior_frames frames; none on the chain tree
    prior_frames: int
    init: str | None  # the network whose final weights it starts from
    init_layers: str  # all | encoder: every layer of init, or all but its output layer
    low_rank: dict[str, float] | None  # energy or keep: init's layers factorised by truncated SVD
    prune: dict[str, float] | None  # fraction: init's smallest weights zeroed
    teacher: dict[str, Any] | None  # network, weight, temperature: teacher–student training
    sizes: dict[str, Any]  # type and sizes: what asrflow.nnet.models.build_model takes
    members: tuple[str, ...]  # ensemble: its members
    training: Training | None  # None for an ensemble (assembled, not trained)
    parallel: Parallel | None

    @property
    def trained(self) -> bool:
        return self.type != "ensemble"


def training(config: dict[str, Any], system: str) -> Training:
    """Network ``system``'s training settings; ``seed`` is the experiment's unless the network sets one."""
    merged = model_train(config, system)
    seed = merged.get("seed")
    return Training.from_dict({**merged, "seed": config["seed"] if seed is None else seed})


def parallel(config: dict[str, Any], system: str) -> Parallel:
    """Network ``system``'s parallel settings (``nnet.parallel`` with its own overrides)."""
    return Parallel.from_dict({**config["nnet"]["parallel"], **config["nnet"]["models"][system].get("parallel", {})})


#: Per decoder kind (:func:`decoder_kind`), the settings of ``nnet.decode`` that only that kind reads, which are
#: also the names of its ``tune`` lists; every kind reads the others (shard_utts, frame_skip, batch_frames, device,
#: precision and the tuning's enabled, search and max_utterances).
KIND_SETTINGS: dict[str, tuple[str, ...]] = {
    "hclg": ("acoustic_scale", "insertion_penalty", "graph_beam", "max_active"),
    "tlg": ("tlg_acoustic_scale", "tlg_insertion_penalty", "graph_beam", "max_active"),
    "prefix": ("beam", "lm_weight", "word_bonus", "prune", "vocabulary"),
}


def decoder_kind(model: dict[str, Any]) -> str:
    """How a network of ``nnet.models`` is decoded: ``hclg`` (hybrid), ``tlg`` (CTC over phones) or ``prefix``."""
    if model["objective"] == "hybrid":
        return "hclg"
    return "tlg" if model.get("units") == "phone" else "prefix"


def other_kinds_settings(kind: str) -> frozenset[str]:
    """The settings of ``nnet.decode`` (and lists of its ``tune``) that decoder ``kind`` never reads."""
    return frozenset(k for other in KIND_SETTINGS.values() for k in other) - frozenset(KIND_SETTINGS[kind])


def decoding(config: dict[str, Any], system: str | None = None) -> Decoding:
    """The networks' decoding settings (``nnet.decode``), with network ``system``'s own ``decode`` overrides
    (its ``tune`` lists over ``nnet.decode.tune``'s, key by key)."""
    own = dict(config["nnet"]["models"][system].get("decode", {})) if system is not None else {}
    if "tune" in own:  # its lists over nnet.decode.tune's, key by key
        own["tune"] = {**config["nnet"]["decode"]["tune"], **own["tune"]}
    return Decoding.from_dict({**config["nnet"]["decode"], **own})


def network(config: dict[str, Any], system: str) -> Network:
    """Network ``system`` of ``nnet.models``, resolved."""
    if system not in config["nnet"]["models"]:
        raise ConfigError(f"{system!r} is not a network in nnet.models")
    model = config["nnet"]["models"][system]
    trained = model["type"] != "ensemble"
    return Network(name=system, type=model["type"], objective=model["objective"], units=model["units"],
                   vocab_size=model["vocab_size"], features=model_features(config, system),
                   alignments=model_alignments(config, system), cmvn=model_cmvn(config, system),
                   priors="none" if model_alignments(config, system) == CHAIN else config["nnet"]["priors"],
                   prior_frames=config["nnet"]["prior_frames"],
                   init=model.get("init"), init_layers=model.get("init_layers", "all"),
                   low_rank=model.get("low_rank"), prune=model.get("prune"),
                   teacher=model.get("teacher"),
                   sizes=network_config(model), members=tuple(model.get("members", ())),
                   training=training(config, system) if trained else None,
                   parallel=parallel(config, system) if trained else None)
