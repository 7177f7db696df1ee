"""Validate a config against ``workflow/schemas/config.schema.yaml`` and fill its defaults.

Errors name the offending key by its dotted path (``features.mfcc.num_ceps``) and, for an
unknown key, suggest the closest known one, so a typo never turns into a traceback or a
silently ignored setting.
"""

from __future__ import annotations

import copy
import difflib
import hashlib
import json
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from asrflow.config.sizes import complete_model_config, expand_preset, network_config
from asrflow.parallel import overlap_conflict

_REPO_ROOT = Path(__file__).resolve().parents[3]

#: PyYAML's safe loader, in C where PyYAML was built with libyaml (the same documents, several times faster)
YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class ConfigError(ValueError):
    """The configuration is invalid; the message names the key and the problem."""


def schema_path() -> Path:
    """Path of the JSON schema (YAML-encoded) shipped in ``workflow/schemas/``."""
    return _REPO_ROOT / "workflow" / "schemas" / "config.schema.yaml"


def _load_schema(path: Path | None = None) -> dict[str, Any]:
    path = path or schema_path()
    if not path.is_file():
        raise ConfigError(f"config schema not found at {path}")
    with open(path, encoding="utf-8") as handle:
        return yaml.load(handle, Loader=YAML_LOADER)


def _deref(schema: Mapping[str, Any], root: Mapping[str, Any]) -> Mapping[str, Any]:
    ref = schema.get("$ref")
    if not ref:
        return schema
    target = root
    for part in ref.removeprefix("#/").split("/"):
        target = target[part]
    return {**target, **{k: v for k, v in schema.items() if k != "$ref"}}


def _fill_defaults(instance: Any, schema: Mapping[str, Any], root: Mapping[str, Any] | None = None) -> None:
    """Recursively set ``default`` values of missing properties (of objects, and of objects in arrays).

    Follows local ``$ref`` and ``additionalProperties`` schemas (named entries such as
    ``nnet.models.<name>``); a schema marked ``x-no-defaults`` (overrides) is left as given.
    """
    root = root or schema
    schema = _deref(schema, root)
    if isinstance(instance, list) and isinstance(schema.get("items"), Mapping):
        for item in instance:
            _fill_defaults(item, schema["items"], root)
        return
    if not isinstance(instance, dict) or schema.get("x-no-defaults"):
        return
    properties = schema.get("properties", {})
    for key, sub in properties.items():
        sub = _deref(sub, root)
        if key not in instance and "default" in sub:
            instance[key] = copy.deepcopy(sub["default"])
        if key in instance:
            _fill_defaults(instance[key], sub, root)
    extra = schema.get("additionalProperties")
    if isinstance(extra, Mapping):
        for key in set(instance) - set(properties):
            _fill_defaults(instance[key], extra, root)


def definition_defaults(name: str) -> dict[str, Any]:
    """The schema's defaults of ``$defs/<name>`` as an object: what an omitted optional block means."""
    schema = _load_schema()
    instance: dict[str, Any] = {}
    _fill_defaults(instance, schema["$defs"][name], schema)
    return instance


def _dotted(path: Iterable[Any]) -> str:
    return ".".join(str(p) for p in path) or "<top level>"


def _explain(error: jsonschema.ValidationError, schema: Mapping[str, Any]) -> str:
    where = _dotted(error.absolute_path)
    if error.validator == "additionalProperties":
        known = sorted(error.schema.get("properties", {}))
        extra = sorted(set(error.instance) - set(known))
        parts = []
        for key in extra:
            full = key if where == "<top level>" else f"{where}.{key}"
            hint = difflib.get_close_matches(key, known, n=1)
            suggestion = f" (did you mean '{hint[0]}'?)" if hint else ""
            parts.append(f"unknown config key '{full}'{suggestion}; known keys here: {', '.join(known)}")
        return "; ".join(parts)
    if error.validator == "required":
        missing = [k for k in error.validator_value if k not in error.instance]
        base = "" if where == "<top level>" else f"{where}."
        return "; ".join(f"missing required config key '{base}{k}'" for k in missing)
    return f"config key '{where}': {error.message}"


#: Config paths an overlay replaces instead of merging into: an experiment that lists its own
#: networks gets exactly those, not the default experiment's with the same names mixed in.
REPLACED_PATHS = (("nnet", "models"),)


def merge(base: Mapping[str, Any], overlay: Mapping[str, Any], path: tuple[str, ...] = ()) -> dict[str, Any]:
    """Deep-merge ``overlay`` into a copy of ``base`` (dicts merge, everything else replaces;
    the dicts at :data:`REPLACED_PATHS` are replaced whole)."""
    out = copy.deepcopy(dict(base))
    for key, value in overlay.items():
        here = (*path, key)
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping) and here not in REPLACED_PATHS:
            out[key] = merge(out[key], value, here)
        else:
            out[key] = copy.deepcopy(value)
    return out


def reapply_replaced(config: dict[str, Any], overlay_files: Iterable[str | Path]) -> dict[str, Any]:
    """Give :data:`REPLACED_PATHS` their overlay-replace meaning in a config another tool merged
    (Snakemake deep-merges ``--configfile`` files into the Snakefile's ``configfile``)."""
    out = copy.deepcopy(config)
    for path in overlay_files:
        with open(path, encoding="utf-8") as handle:
            data = yaml.load(handle, Loader=YAML_LOADER) or {}
        for keys in REPLACED_PATHS:
            node: Any = data
            for key in keys:
                node = node.get(key) if isinstance(node, Mapping) else None
            if node is not None:
                target = out
                for key in keys[:-1]:
                    target = target.setdefault(key, {})
                target[keys[-1]] = copy.deepcopy(node)
    return out


def resolve_config(raw: Mapping[str, Any], schema_file: Path | None = None) -> dict[str, Any]:
    """Return a validated copy of ``raw`` with every default filled in.

    Raises:
        ConfigError: naming each unknown key, wrong type or missing required value.
    """
    schema = _load_schema(schema_file)
    config = copy.deepcopy(dict(raw or {}))
    _expand_presets(config)
    _fill_defaults(config, schema)
    validator = jsonschema.Draft202012Validator(schema)
    errors = sorted(validator.iter_errors(config), key=lambda e: list(map(str, e.absolute_path)))
    if errors:
        raise ConfigError("invalid configuration:\n  " + "\n  ".join(_explain(e, schema) for e in errors))
    if config["audio"]["min_duration"] >= config["audio"]["max_duration"]:
        raise ConfigError("config key 'audio.min_duration' must be below 'audio.max_duration'")
    if unknown := sorted(set(config["evaluation"]["train_of"]) - set(config["evaluation"]["test_sets"])):
        raise ConfigError(f"config key 'evaluation.train_of': {', '.join(unknown)} not in evaluation.test_sets "
                          f"({', '.join(config['evaluation']['test_sets'])})")
    if (config["lang"]["lexicon"] == "file") != bool(config["lang"]["lexicon_file"]):
        raise ConfigError("config key 'lang.lexicon_file': give it exactly when lang.lexicon is file "
                          f"(lexicon: {config['lang']['lexicon']}, lexicon_file: {config['lang']['lexicon_file']})")
    if config["nnet"]["hold_out"] == "groups" and not config["evaluation"]["groups"]:
        raise ConfigError("config key 'nnet.hold_out': groups draws the held-out speakers from the groups of "
                          "evaluation.groups, which is empty")
    _check_systems(config)
    return config


def _expand_presets(config: dict[str, Any]) -> None:
    """Give every network with a ``preset`` the preset's type and sizes (before defaults, so its own keys win)."""
    models = (config.get("nnet") or {}).get("models") or {}
    for name, model in models.items():
        if isinstance(model, dict):
            try:
                models[name] = expand_preset(model)
            except ValueError as exc:
                raise ConfigError(f"config key 'nnet.models.{name}': {exc}") from None


#: GMM-HMM systems the gmm rule trains (mono: flat start; tri: Δ+ΔΔ triphones; lda: LDA+MLLT triphones;
#: sat: speaker-adaptively trained), in the order each starts from the one before
GMM_SYSTEMS = ("mono", "tri", "lda", "sat")
#: The system whose alignments start each GMM system (its tree is built from them)
GMM_SOURCES = {"tri": "mono", "lda": "tri", "sat": "lda"}
#: GMM systems decoded with fMLLR speaker-adapted features (rule fmllr; Kaldi's decode_fmllr.sh)
FMLLR_SYSTEMS = tuple(f"{g}_fmllr" for g in GMM_SYSTEMS)
#: Systems trained on another system's fMLLR-adapted features, and that system (Kaldi's train_sat.sh);
#: they only make sense decoded with adapted features, as <system>_fmllr
SAT_SOURCES = {"sat": "lda"}
#: The chain tree (``nnet.chain``): what ``alignments`` names for hybrids at a reduced frame rate
CHAIN = "chain"


def _check_systems(config: dict[str, Any]) -> None:
    """Every evaluated system exists; networks get their type's size defaults filled in."""
    models = config["nnet"]["models"]
    evaluated_gmms = [g for g in GMM_SYSTEMS if g not in SAT_SOURCES]
    for system in config["evaluation"]["systems"]:
        if system in SAT_SOURCES:
            raise ConfigError(f"config key 'evaluation.systems': {system} is trained on speaker-adapted features "
                              f"and decodes them only: evaluate {system}_fmllr")
        if system in GMM_SYSTEMS + FMLLR_SYSTEMS:
            if system in FMLLR_SYSTEMS and "mfcc" not in config["features"]["kinds"]:
                raise ConfigError(f"config key 'evaluation.systems': {system} adapts the GMM's MFCC features; "
                                  f"add mfcc to features.kinds")
            continue
        if system not in models:
            hint = difflib.get_close_matches(system, [*evaluated_gmms, *FMLLR_SYSTEMS, *models], n=1)
            raise ConfigError(f"config key 'evaluation.systems': {system!r} is neither a GMM system "
                              f"({', '.join([*evaluated_gmms, *FMLLR_SYSTEMS])}) nor "
                              f"a network in nnet.models" + (f" (did you mean {hint[0]!r}?)" if hint else "")
                              + f"; networks defined: {', '.join(models) or 'none'}")
    for name, model in models.items():
        _check_ensemble(name, model, models)
        _check_speed_perturb(config, name)
        _check_mmi(config, name)
        _check_examples(config, name)
        _check_init(config, name)
        _check_teacher(config, name)
        _check_frames(config, name)
        _check_chain(config, name)
    study = config["nnet"]["parallel_study"]
    if study["enabled"] and (study["system"] not in models or models[study["system"]].get("objective") == "ctc"
                             or models[study["system"]]["type"] == "ensemble"):
        hint = difflib.get_close_matches(study["system"], list(models), n=1)
        raise ConfigError(f"config key 'nnet.parallel_study.system': {study['system']!r} is not a hybrid network in "
                          f"nnet.models" + (f" (did you mean {hint[0]!r}?)" if hint else "")
                          + f"; networks defined: {', '.join(models) or 'none'}")
    for name, model in models.items():
        learners, group, nodes = (model.get("parallel", {}).get(key, config["nnet"]["parallel"][key])
                                  for key in ("learners", "group_size", "nodes"))
        strategy = model.get("parallel", {}).get("strategy", config["nnet"]["parallel"]["strategy"])
        if strategy == "hierarchical" and learners % group:
            raise ConfigError(f"config key 'nnet.models.{name}.parallel': {learners} learners do not split into "
                              f"hierarchical groups of group_size {group}")
        if learners % nodes:
            raise ConfigError(f"config key 'nnet.models.{name}.parallel': {learners} learners do not divide evenly "
                              f"over {nodes} nodes (learners must be a multiple of nodes)")
        overlap, compression = (model.get("parallel", {}).get(key, config["nnet"]["parallel"][key])
                                for key in ("overlap", "compression"))
        if overlap and (problem := overlap_conflict(strategy, compression)):
            raise ConfigError(f"config key 'nnet.models.{name}.parallel': {problem}")
    for name in models:
        _check_features(config, name)
    for name, model in models.items():
        try:
            models[name] = complete_model_config(model)
        except ValueError as exc:
            raise ConfigError(f"config key 'nnet.models.{name}': {exc}") from None


def model_train(config: Mapping[str, Any], system: str) -> dict[str, Any]:
    """``nnet.train`` overlaid with network ``system``'s own ``train`` overrides.

    A nested section (``specaugment``, ``mmi``) is overlaid key by key, so an override
    names only what it changes and the rest keeps ``nnet.train``'s values (and their defaults).
    """
    base = config["nnet"]["train"]
    merged = dict(base)
    for key, value in config["nnet"]["models"][system].get("train", {}).items():
        nested = isinstance(value, dict) and isinstance(base.get(key), dict)
        merged[key] = {**base[key], **value} if nested else value
    return merged


def model_features(config: Mapping[str, Any], system: str) -> str:
    """The feature kind network ``system`` reads: its own ``features``, else ``nnet.features``."""
    return _inherited(config, system, "features")


def model_cmvn(config: Mapping[str, Any], system: str) -> str:
    """How network ``system``'s features are mean-normalised, ``speaker`` or ``utterance``: its own ``cmvn``,
    else ``nnet.cmvn``."""
    return _inherited(config, system, "cmvn")


def model_alignments(config: Mapping[str, Any], system: str) -> str:
    """The GMM system whose alignments, tree and graph hybrid network ``system`` uses (and whose
    fMLLR features it reads): its own ``alignments``, else ``nnet.alignments``."""
    return _inherited(config, system, "alignments")


def feature_gmm(config: Mapping[str, Any], system: str) -> str:
    """The GMM system whose fMLLR features network ``system`` reads with ``features: fmllr``: its alignments'
    GMM, or the chain tree's source."""
    gmm = model_alignments(config, system)
    return config["nnet"]["chain"]["source"] if gmm == CHAIN else gmm


def _inherited(config: Mapping[str, Any], system: str, key: str) -> Any:
    """Network ``system``'s own ``key``, else ``nnet.<key>``; an ensemble's is its first member's (which all
    members share)."""
    if (other := _reads_as(config, system)) is not None:
        return _inherited(config, other, key)
    return config["nnet"]["models"][system].get(key, config["nnet"][key])


def _reads_as(config: Mapping[str, Any], system: str) -> str | None:
    """The network whose features and alignments network ``system`` takes: an ensemble's first member (None for
    a network with its own, or a name not yet checked to exist)."""
    model = config["nnet"]["models"][system]
    other = (model.get("members") or [None])[0] if model["type"] == "ensemble" else None
    return other if other in config["nnet"]["models"] else None


def _members_differ(config: Mapping[str, Any], name: str, value: Callable[[Mapping[str, Any], str], Any]
                    ) -> dict[str, Any] | None:
    """``value(config, member)`` per (defined) member of ensemble ``name`` when they do not all agree, else None."""
    members = [m for m in config["nnet"]["models"][name].get("members", []) if m in config["nnet"]["models"]]
    used = {m: value(config, m) for m in members}
    return used if len(set(used.values())) > 1 else None


def _check_features(config: Mapping[str, Any], name: str) -> None:
    """The kind a network reads is extracted (fmllr: the GMM's MFCCs are); an ensemble's members read one kind."""
    model = config["nnet"]["models"][name]
    kinds = config["features"]["kinds"]
    if model["type"] == "ensemble":
        if used := _members_differ(config, name, model_features):
            raise ConfigError(f"config key 'nnet.models.{name}.members': the members read different features "
                              f"({', '.join(f'{m}: {k}' for m, k in used.items())}); an ensemble decodes one kind")
        if norms := _members_differ(config, name, model_cmvn):
            raise ConfigError(f"config key 'nnet.models.{name}.members': the members normalise their features "
                              f"differently ({', '.join(f'{m}: cmvn {k}' for m, k in norms.items())}); an "
                              f"ensemble feeds them one input")
        return
    kind = model_features(config, name)
    key = f"nnet.models.{name}.features" if "features" in model else "nnet.features"
    needed = "mfcc" if kind == "fmllr" else kind
    if needed not in kinds:
        why = " (fmllr adapts the GMM's MFCC features)" if kind == "fmllr" else ""
        raise ConfigError(f"config key '{key}': {kind!r} needs {needed} features, which are not extracted{why}; "
                          f"add {needed} to features.kinds ({', '.join(kinds)})")


def _check_mmi(config: Mapping[str, Any], name: str) -> None:
    """MMI (``train.mmi.weight`` > 0) trains a hybrid on whole utterances: the denominator graph starts at
    an utterance's first frame."""
    model = config["nnet"]["models"][name]
    if model["type"] == "ensemble" or not model_train(config, name)["mmi"]["weight"]:
        return
    if model.get("objective", "hybrid") != "hybrid":
        raise ConfigError(f"config key 'nnet.models.{name}.train.mmi': MMI trains hybrid networks (tied states "
                          f"against the decoding graph); {name} is a {model['objective']} network")
    if model_train(config, name)["chunk_frames"]:
        raise ConfigError(f"config key 'nnet.models.{name}.train.mmi': MMI needs whole utterances (the graph's "
                          f"paths start at the first frame); set train.chunk_frames to 0 for {name}")
    if model_train(config, name)["mmi"]["tolerance"] and model_alignments(config, name) != CHAIN:
        raise ConfigError(f"config key 'nnet.models.{name}.train.mmi.tolerance': a numerator with slack moves the "
                          f"phones of a chain alignment; {name} trains on {model_alignments(config, name)}'s "
                          f"(set alignments: chain, or tolerance 0)")
    separate = model_train(config, name)["mmi"]["cross_entropy"] == "separate"
    if separate and (model["type"] not in ("dnn", "lstm", "cnn") or network_config(model).get("multi_frame", 1) > 1):
        raise ConfigError(f"config key 'nnet.models.{name}.train.mmi.cross_entropy': a separate cross-entropy "
                          f"output needs one linear output layer (dnn, lstm, cnn without multi_frame); {name} is "
                          f"a {model['type']} with multi_frame {network_config(model).get('multi_frame', 1)}")


SKIPPING = ("dnn", "cnn")  # networks that can run every k-th frame (frame_skip, multi_frame)


def _check_frames(config: Mapping[str, Any], name: str) -> None:
    """Frame skipping and multi-frame outputs need feed-forward networks (DNN, CNN; an ensemble's members too),
    never both at once; ``train.epochs`` 0 (a decoding variant) needs ``init``."""
    models = config["nnet"]["models"]
    model = models[name]
    skip = {**config["nnet"]["decode"], **model.get("decode", {})}["frame_skip"]
    heads = network_config(model).get("multi_frame", 1)
    if heads > 1 and (model["type"] not in SKIPPING or model["objective"] != "hybrid"):
        raise ConfigError(f"config key 'nnet.models.{name}.multi_frame': multi-frame outputs are for dnn and cnn "
                          f"hybrids, not a {model['type']} {model['objective']} network")
    if skip > 1:
        nets = [models[m] for m in model.get("members", [])] if model["type"] == "ensemble" else [model]
        for net in nets:
            if net["type"] not in SKIPPING:
                raise ConfigError(f"{name}: frame_skip {skip} needs dnn or cnn networks; a {net['type']} computes "
                                  f"every frame from the whole utterance")
            if network_config(net).get("multi_frame", 1) > 1:
                raise ConfigError(f"{name}: frame_skip {skip} with a multi-frame network (it already runs every "
                                  f"k-th frame); set frame_skip 1 for it")
    if model["type"] != "ensemble" and model_train(config, name)["epochs"] == 0 and "init" not in model:
        raise ConfigError(f"config key 'nnet.models.{name}.train.epochs': 0 epochs needs init (the trained network "
                          f"it stands for)")


def _check_chain(config: Mapping[str, Any], name: str) -> None:
    """A hybrid outputs one frame in ``subsampling`` only on the chain tree, and a network on the chain tree is a
    hybrid whose ``subsampling`` is the tree's ``frame_subsampling``, computing every frame it outputs."""
    model = config["nnet"]["models"][name]
    if model["type"] == "ensemble" or model.get("objective", "hybrid") != "hybrid":
        return
    factor, subsampling = config["nnet"]["chain"]["frame_subsampling"], network_config(model).get("subsampling", 1)
    key = f"config key 'nnet.models.{name}"
    if model_alignments(config, name) != CHAIN:
        if subsampling != 1:
            raise ConfigError(f"{key}.subsampling': a hybrid on the {model_alignments(config, name)} GMM's tree "
                              f"outputs every frame (its targets are the GMM's frames); subsampling {subsampling} "
                              f"needs alignments: chain")
        return
    if model["type"] != "cnn" or subsampling != factor:
        raise ConfigError(f"{key}': a network on the chain tree outputs one frame in nnet.chain.frame_subsampling "
                          f"({factor}): a cnn (TDNN) with subsampling {factor}, not a {model['type']} with "
                          f"subsampling {subsampling}")
    if {**config["nnet"]["decode"], **model.get("decode", {})}["frame_skip"] > 1:
        raise ConfigError(f"{key}.decode.frame_skip': a network on the chain tree already outputs one frame in "
                          f"{factor}; set frame_skip 1")


def _check_teacher(config: Mapping[str, Any], name: str) -> None:
    """A student (``teacher``) is a hybrid trained on whole utterances without MMI, and its teacher a trained
    hybrid or ensemble over the same features and alignments that does not itself depend on the student."""
    models = config["nnet"]["models"]
    model = models[name]
    if "teacher" not in model:
        return
    key = f"config key 'nnet.models.{name}.teacher'"
    source = model["teacher"]["network"]
    if model["type"] == "ensemble" or model.get("objective", "hybrid") != "hybrid":
        raise ConfigError(f"{key}: a student is a trained hybrid network; {name} is a "
                          f"{'an ensemble' if model['type'] == 'ensemble' else model['objective'] + ' network'}")
    if source not in models or source == name:
        hint = difflib.get_close_matches(source, [m for m in models if m != name], n=1)
        raise ConfigError(f"{key}: {source!r} is not another network in nnet.models"
                          + (f" (did you mean {hint[0]!r}?)" if hint else ""))
    if models[source].get("objective", "hybrid") != "hybrid":
        raise ConfigError(f"{key}: {source!r} is a {models[source]['objective']} network; a teacher is a hybrid "
                          f"over the student's tied states")
    differences = [what for what, fn in (("features", model_features), ("alignments", model_alignments))
                   if fn(config, name) != fn(config, source)]
    if differences:
        raise ConfigError(f"{key}: {source!r} and {name} differ in {', '.join(differences)} (a teacher reads the "
                          f"student's batches and scores its tied states)")
    train = model_train(config, name)
    if train["chunk_frames"] or train["example_frames"] or train["mmi"]["weight"]:
        raise ConfigError(f"{key}: a student trains on whole utterances with cross-entropy (the teacher sees its "
                          f"batches): set train.chunk_frames, train.example_frames and train.mmi.weight to 0")
    seen, todo = set(), [source]
    while todo:  # the networks the teacher needs trained first
        other = todo.pop()
        if other == name:
            raise ConfigError(f"{key}: {source!r} depends on {name} (through init, teacher or members)")
        if other in seen or other not in models:
            continue
        seen.add(other)
        dependency = models[other]
        todo += [*dependency.get("members", ()), *([dependency["init"]] if "init" in dependency else []),
                 *([dependency["teacher"]["network"]] if "teacher" in dependency else [])]


def _check_examples(config: Mapping[str, Any], name: str) -> None:
    """Training examples (``train.example_frames`` > 0) carry a fixed context: they need a feed-forward hybrid
    whose every output frame sees a bounded, full-rate window (a DNN, a CNN-TDNN without subsampling)."""
    model = config["nnet"]["models"][name]
    if model["type"] == "ensemble":
        return
    train = model_train(config, name)
    if not train["example_frames"]:
        return
    key = f"config key 'nnet.models.{name}.train.example_frames'"
    if model.get("objective", "hybrid") != "hybrid" or model["type"] not in ("dnn", "cnn") \
            or model.get("subsampling", 1) != 1:
        raise ConfigError(f"{key}: training examples need a feed-forward hybrid (dnn, or cnn without subsampling) "
                          f"whose outputs see a bounded window; {name} is a {model['type']} "
                          f"{model.get('objective', 'hybrid')} network (recurrent ones use train.chunk_frames)")
    if train["chunk_frames"] or train["mmi"]["weight"]:
        raise ConfigError(f"{key}: examples replace whole utterances; chunk_frames and mmi need those, set them "
                          f"to 0 for {name}")


COMPRESSIONS = ("low_rank", "prune")  # ways a network is made smaller from its init's weights


#: what a network started from another's encoder (``init_layers: encoder``) may have of its own: its outputs
OUTPUTS = ("objective", "units", "alignments")


def _check_init(config: Mapping[str, Any], name: str) -> None:
    """A network fine-tuned from another (``init``) starts from that network's weights: it names a trained
    network of the same shape (type, sizes, objective, units, features, alignments; with ``init_layers:
    encoder`` only type, sizes and features, its output layer being new), and no chain of ``init`` leads back
    to itself."""
    models = config["nnet"]["models"]
    model = models[name]
    compressions = [k for k in COMPRESSIONS if k in model]
    if len(compressions) > 1:
        raise ConfigError(f"nnet.models.{name}: {' and '.join(compressions)} cannot be combined; choose one")
    if "init" not in model:
        if "init_layers" in model:
            raise ConfigError(f"config key 'nnet.models.{name}.init_layers': it says what init gives; set "
                              f"nnet.models.{name}.init to the network it starts from")
        if compressions:
            raise ConfigError(f"config key 'nnet.models.{name}.{compressions[0]}': a compressed network is made from a "
                              f"trained one: set nnet.models.{name}.init to the network it starts from")
        return
    key = f"config key 'nnet.models.{name}.init'"
    source = model["init"]
    if model["type"] == "ensemble":
        raise ConfigError(f"{key}: an ensemble is assembled from its members, not trained; it has no init")
    if source not in models:
        hint = difflib.get_close_matches(source, list(models), n=1)
        raise ConfigError(f"{key}: {source!r} is not a network in nnet.models"
                          + (f" (did you mean {hint[0]!r}?)" if hint else ""))
    other = models[source]
    if other["type"] == "ensemble":
        raise ConfigError(f"{key}: {source!r} is an ensemble; init names one trained network")
    variant = model_train(config, name)["epochs"] == 0  # a decoding variant: the init network as it is
    if any(k in other for k in COMPRESSIONS) and not (variant and not compressions):
        raise ConfigError(f"{key}: {source!r} is compressed ({', '.join(k for k in COMPRESSIONS if k in other)}); "
                          f"init names a network of whole layers, unless {name} is a decoding variant of it "
                          f"(train.epochs 0, no {' or '.join(COMPRESSIONS)} of its own)")
    encoder = model.get("init_layers") == "encoder"  # init's layers but its output: the outputs may differ
    if encoder and (compressions or variant):
        raise ConfigError(f"config key 'nnet.models.{name}.init_layers': encoder gives a new output layer to train; "
                          f"not with {' or '.join(compressions) if compressions else 'train.epochs 0'}")
    shape = network_config(other)
    if shape.get("multi_frame") == 1:  # a one-head network: a multi-frame one starts with every head its output layer
        shape["multi_frame"] = network_config(model).get("multi_frame", 1)
    differences = [what for what, mine, theirs in (
        ("type and sizes", network_config(model), shape),
        ("objective", model["objective"], other["objective"]),
        ("units", (model["units"], model["vocab_size"]) if model["objective"] == "ctc" else None,
         (other["units"], other["vocab_size"]) if other["objective"] == "ctc" else None),
        ("features", model_features(config, name), model_features(config, source)),
        ("alignments", model_alignments(config, name), model_alignments(config, source)))
        if mine != theirs and not (encoder and what in OUTPUTS)]
    if differences:
        why = ("a network on another's encoder has its type, sizes and features" if encoder else
               "a fine-tuned network has its starting network's shape and outputs; with init_layers: encoder, "
               "only its type, sizes and features")
        raise ConfigError(f"{key}: {name} cannot start from {source!r}'s weights: their {', '.join(differences)} "
                          f"differ ({why})")
    chain = [name]
    while "init" in models[chain[-1]]:
        chain.append(models[chain[-1]]["init"])
        if chain[-1] == name:
            raise ConfigError(f"{key}: the init chain {' -> '.join(chain)} leads back to {name}")
        if chain[-1] not in models or chain[-1] in chain[:-1]:
            break


def _check_speed_perturb(config: Mapping[str, Any], name: str) -> None:
    """A network with speed_perturb needs factors; an ensemble's members all train with it or all without
    (their tied-state priors come from the alignments they trained on)."""
    model = config["nnet"]["models"][name]
    if model["type"] == "ensemble":
        perturbed = [m for m in model.get("members", []) if model_train(config, m)["speed_perturb"]]
        if perturbed and len(perturbed) < len(model["members"]):
            raise ConfigError(f"config key 'nnet.models.{name}.members': {', '.join(perturbed)} train with "
                              f"speed_perturb and the others without; an ensemble's members share one set of "
                              f"alignments and priors")
        if used := _members_differ(config, name, model_alignments):
            raise ConfigError(f"config key 'nnet.models.{name}.members': the members train on the alignments of "
                              f"different GMMs ({', '.join(f'{m}: {a}' for m, a in used.items())}); an ensemble's "
                              f"members share one tree")
    elif model_train(config, name)["speed_perturb"] and not set(config["audio"]["speed_perturb"]) - {1.0}:
        raise ConfigError(f"config key 'nnet.models.{name}': speed_perturb is on but audio.speed_perturb "
                          f"has no factor other than 1.0 (e.g. [0.9, 1.0, 1.1])")


def _check_ensemble(name: str, model: dict[str, Any], models: dict[str, Any]) -> None:
    """An ensemble names two or more hybrid networks of ``models`` (no ensembles); other types name none."""
    key = f"config key 'nnet.models.{name}"
    if model["type"] != "ensemble":
        for option in ("members", "combine"):
            if option in model:
                raise ConfigError(f"{key}.{option}': only an ensemble has {option} (this is a {model['type']} model)")
        return
    if "members" not in model:
        raise ConfigError(f"{key}': an ensemble needs members (two or more hybrid networks of nnet.models)")
    if model["objective"] != "hybrid":
        raise ConfigError(f"{key}.objective': ensembles combine hybrid networks only")
    for member in model["members"]:
        other = models.get(member)
        if other is None:
            hint = difflib.get_close_matches(member, list(models), n=1)
            raise ConfigError(f"{key}.members': {member!r} is not a network in nnet.models"
                              + (f" (did you mean {hint[0]!r}?)" if hint else ""))
        if other["type"] == "ensemble" or other["objective"] != "hybrid":
            raise ConfigError(f"{key}.members': {member!r} is not a hybrid network (ensembles combine the "
                              f"tied-state posteriors of hybrid networks trained on the same alignments)")


def load_config(*paths: str | Path, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Load YAML files (later ones overlay earlier ones), apply ``overrides``, resolve."""
    merged: dict[str, Any] = {}
    for path in paths:
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"config file not found: {path}")
        try:
            with open(path, encoding="utf-8") as handle:
                data = yaml.load(handle, Loader=YAML_LOADER) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path} is not valid YAML: {exc}") from exc
        if not isinstance(data, dict):
            raise ConfigError(f"config file {path} must hold a mapping at the top level")
        merged = merge(merged, data)
    if overrides:
        merged = merge(merged, overrides)
    return resolve_config(merged)


def section_fingerprint(config: Mapping[str, Any], *keys: str) -> str:
    """A short stable hash of some config sections (Snakemake params use it to rerun what changed)."""
    parts = {k: config.get(k) for k in keys}
    blob = json.dumps(parts, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def write_resolved(config: Mapping[str, Any], path: str | Path) -> bool:
    """Write the resolved config as YAML, only if its content changed (keeps mtimes stable).

    Returns True when the file was (re)written.
    """
    path = Path(path)
    text = "# resolved by asrflow (schema defaults filled); do not edit, edit config/ instead\n"
    text += yaml.safe_dump(dict(config), sort_keys=False, default_flow_style=False)
    if path.is_file() and path.read_text(encoding="utf-8") == text:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
    return True
