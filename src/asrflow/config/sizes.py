"""The sizes a network config may set, with their defaults, per model type (no torch import).

Config resolution (every asrflow command and the Snakefile) fills in a network's sizes from
here; :func:`asrflow.nnet.models.build_model` passes them to the model class, whose keyword
arguments are exactly these names (a unit test keeps the two in step).
"""

from __future__ import annotations

from typing import Any

SIZES: dict[str, dict[str, Any]] = {
    "dnn": {"hidden": 512, "layers": 4, "context": 5, "dropout": 0.1},
    "lstm": {"hidden": 320, "layers": 3, "bidirectional": True, "projection": 0, "dropout": 0.1},
    "cnn": {"channels": [32, 32], "tdnn_dim": 384, "tdnn_dilations": [1, 2, 3, 3], "subsampling": 1,
            "dropout": 0.1},
    "ensemble": {"members": [], "combine": "log_linear"},
}

#: Config keys that are not model sizes (objective, units, training and parallel overrides).
NON_SIZE_KEYS = ("type", "objective", "units", "vocab_size", "train", "parallel", "features", "alignments",
                 "cmvn", "init")


def complete_model_config(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` with the type's size defaults filled in; a size key the type lacks is an error."""
    kind = config.get("type")
    if kind not in SIZES:
        raise ValueError(f"unknown model type {kind!r}; known: {', '.join(SIZES)}")
    unknown = sorted(set(config) - set(SIZES[kind]) - set(NON_SIZE_KEYS))
    if unknown:
        raise ValueError(f"{', '.join(unknown)} not an option of a {kind} model; its options: "
                         f"{', '.join(SIZES[kind])}")
    if config.get("objective", "hybrid") == "hybrid" and config.get("subsampling", 1) != 1:
        raise ValueError("subsampling must be 1 for a hybrid model (its frame targets are not subsampled)")
    return _with_default_sizes(config, kind)


def network_config(config: dict[str, Any]) -> dict[str, Any]:
    """The type and sizes (what :func:`asrflow.nnet.models.build_model` takes) of a network config,
    with the type's defaults for sizes it leaves out."""
    sizes = {k: v for k, v in config.items() if k == "type" or k not in NON_SIZE_KEYS}
    return _with_default_sizes(sizes, sizes.get("type"))


def _with_default_sizes(config: dict[str, Any], kind: str | None) -> dict[str, Any]:
    """A copy of ``config`` with ``kind``'s default sizes for those it lacks (lists copied, never shared)."""
    out = dict(config)
    for name, default in SIZES.get(kind, {}).items():
        out.setdefault(name, list(default) if isinstance(default, list) else default)
    return out
