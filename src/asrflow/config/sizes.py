"""The sizes a network config may set, with their defaults, per model type (no torch import).

Config resolution (every asrflow command and the Snakefile) fills in a network's sizes from
here; :func:`asrflow.nnet.models.build_model` passes them to the model class, whose keyword
arguments are exactly these names (a unit test keeps the two in step).
"""

from __future__ import annotations

from typing import Any

SIZES: dict[str, dict[str, Any]] = {
    "dnn": {"hidden": 512, "layers": 4, "context": 5, "multi_frame": 1, "dropout": 0.1},
    "lstm": {"hidden": 320, "layers": 3, "bidirectional": True, "projection": 0, "dropout": 0.1},
    "cnn": {"channels": [32, 32], "tdnn_dim": 384, "tdnn_dilations": [1, 2, 3, 3], "subsampling": 1,
            "norm": "batch", "multi_frame": 1, "dropout": 0.1},
    "conformer": {"dim": 144, "layers": 4, "heads": 4, "ffn_dim": 576, "kernel": 15, "channels": [64, 64],
                  "subsampling": 1, "norm": "batch", "dropout": 0.1},
    "ensemble": {"members": [], "combine": "log_linear"},
}

#: Networks of realistic size, one ``preset`` key away from any network config: the preset gives
#: the type and sizes, keys beside it override them (parameters with 40-dim input and 3,000 outputs).
PRESETS: dict[str, dict[str, Any]] = {
    # the classic hybrid DNN: 6 × 2048 over ±5 spliced frames (28.1 M)
    "dnn_6x2048": {"type": "dnn", "hidden": 2048, "layers": 6, "context": 5},
    # two 2-D convolutions, then five 1,024-wide TDNN layers (19.7 M)
    "cnn_tdnn_20m": {"type": "cnn", "channels": [64, 128], "tdnn_dim": 1024, "tdnn_dilations": [1, 1, 2, 3, 3]},
    # three bidirectional LSTM layers of 512 cells per direction (17.9 M)
    "blstm_3x512": {"type": "lstm", "hidden": 512, "layers": 3, "bidirectional": True},
    # a Conformer of 12 blocks of width 256 over 4× subsampled frames, for CTC (18.9 M with 500 units)
    "conformer_20m": {"type": "conformer", "dim": 256, "layers": 12, "heads": 4, "ffn_dim": 1024, "kernel": 31,
                      "channels": [128, 128], "subsampling": 4},
}

#: Config keys that are not model sizes (objective, units, training and parallel overrides).
NON_SIZE_KEYS = ("type", "preset", "objective", "units", "vocab_size", "train", "parallel", "features", "alignments",
                 "cmvn", "init", "init_layers", "low_rank", "prune", "teacher", "decode")


def expand_preset(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with its ``preset``'s type and sizes under the keys it sets itself (unchanged without one)."""
    name = config.get("preset")
    if name is None:
        return dict(config)
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}")
    preset = PRESETS[name]
    if config.get("type", preset["type"]) != preset["type"]:
        raise ValueError(f"preset {name} is a {preset['type']} model, but type is {config['type']}")
    return {**{k: list(v) if isinstance(v, list) else v for k, v in preset.items()}, **config}


def complete_model_config(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with its preset and the type's size defaults filled in; a size key the type lacks is an error."""
    config = expand_preset(config)
    kind = config.get("type")
    if kind not in SIZES:
        raise ValueError(f"unknown model type {kind!r}; known: {', '.join(SIZES)}")
    unknown = sorted(set(config) - set(SIZES[kind]) - set(NON_SIZE_KEYS))
    if unknown:
        raise ValueError(f"{', '.join(unknown)} not an option of a {kind} model; its options: "
                         f"{', '.join(SIZES[kind])}")
    return _with_default_sizes(config, kind)


def network_config(config: dict[str, Any]) -> dict[str, Any]:
    """The type and sizes (what :func:`asrflow.nnet.models.build_model` takes) of a network config,
    with the type's defaults for sizes it leaves out."""
    sizes = {k: v for k, v in expand_preset(config).items() if k == "type" or k not in NON_SIZE_KEYS}
    return _with_default_sizes(sizes, sizes.get("type"))


def _with_default_sizes(config: dict[str, Any], kind: str | None) -> dict[str, Any]:
    """A copy of ``config`` with ``kind``'s default sizes for those it lacks (lists copied, never shared)."""
    out = dict(config)
    for name, default in SIZES.get(kind, {}).items():
        out.setdefault(name, list(default) if isinstance(default, list) else default)
    return out
