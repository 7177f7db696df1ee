"""Experiment configuration: load YAML, merge overlays, validate against the schema, fill defaults."""

from asrflow.config.schema import (
    CHAIN,
    FMLLR_SYSTEMS,
    GMM_SOURCES,
    GMM_SYSTEMS,
    SAT_SOURCES,
    ConfigError,
    feature_gmm,
    load_config,
    model_alignments,
    model_cmvn,
    model_features,
    model_train,
    resolve_config,
    schema_path,
    section_fingerprint,
    write_resolved,
)

__all__ = [
    "CHAIN",
    "FMLLR_SYSTEMS",
    "GMM_SOURCES",
    "GMM_SYSTEMS",
    "SAT_SOURCES",
    "ConfigError",
    "feature_gmm",
    "load_config",
    "model_alignments",
    "model_cmvn",
    "model_features",
    "model_train",
    "resolve_config",
    "schema_path",
    "section_fingerprint",
    "write_resolved",
]
