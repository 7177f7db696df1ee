"""One MLflow parent run per pipeline invocation, one nested run per stage.

The Snakefile's ``onstart`` handler opens the parent run and exports its id in
``$ASRFLOW_PARENT_RUN_ID``; every stage (a separate process, maybe on another node) opens a
run tagged with that parent. Every run carries the resolved config as params, the git
commit, package versions and, for stages, their metrics and artifacts.

Default store: ``sqlite:///<results_dir>/mlflow.db`` with artifacts in
``<results_dir>/mlartifacts``; ``$MLFLOW_TRACKING_URI`` or ``tracking.uri`` override it.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

PARENT_ENV = "ASRFLOW_PARENT_RUN_ID"
_PACKAGES = ("asrflow", "torch", "mlflow", "snakemake", "dask", "distributed",
             "numpy", "soundfile", "soxr", "kaldiio", "sentencepiece", "num2words")


def tracking_uri(config: Mapping[str, Any]) -> str:
    """``tracking.uri``, else ``$MLFLOW_TRACKING_URI``, else a SQLite file under the results folder."""
    if config["tracking"].get("uri"):
        return config["tracking"]["uri"]
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return os.environ["MLFLOW_TRACKING_URI"]
    db = Path(config["results_dir"]).resolve() / "mlflow.db"
    db.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{db}"


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Flatten a nested config to dotted keys with string values (MLflow params)."""
    out: dict[str, str] = {}
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, name + "."))
        else:
            out[name] = json.dumps(value) if isinstance(value, (list, tuple)) else str(value)
    return out


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, check=True,
                              cwd=Path(__file__).resolve().parent).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def environment_info() -> dict[str, str]:
    """Git commit (and whether the tree is dirty), Python and package versions."""
    info = {"git_commit": _git("rev-parse", "HEAD") or "unknown",
            "git_dirty": str(bool(_git("status", "--porcelain"))),
            "python": platform.python_version(), "platform": platform.platform()}
    for name in _PACKAGES:
        try:
            info[f"version.{name}"] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return info


def _mlflow(config: Mapping[str, Any]):
    import mlflow

    mlflow.set_tracking_uri(tracking_uri(config))
    name = config["experiment"]
    experiment = mlflow.get_experiment_by_name(name)
    if experiment is None:
        artifacts = (Path(config["results_dir"]).resolve() / "mlartifacts").as_uri()
        uri = tracking_uri(config)
        # A SQLite store keeps artifacts beside it; a server decides for itself.
        location = artifacts if uri.startswith("sqlite:") else None
        try:
            experiment_id = mlflow.create_experiment(name, artifact_location=location)
        except mlflow.exceptions.MlflowException:  # created meanwhile by a parallel stage
            experiment_id = mlflow.get_experiment_by_name(name).experiment_id
    else:
        experiment_id = experiment.experiment_id
    return mlflow, experiment_id


def start_pipeline_run(config: Mapping[str, Any], name: str = "pipeline") -> str | None:
    """Open the parent run of one pipeline invocation; return its id (None if tracking is off)."""
    if not config["tracking"]["enabled"]:
        return None
    mlflow, experiment_id = _mlflow(config)
    client = mlflow.MlflowClient()
    env = environment_info()
    run = client.create_run(experiment_id, run_name=name,
                            tags={"asrflow.kind": "pipeline", **{f"asrflow.{k}": v for k, v in env.items()},
                                  "mlflow.source.git.commit": env["git_commit"]})
    _log_params(client, run.info.run_id, flatten(config))
    return run.info.run_id


def end_pipeline_run(config: Mapping[str, Any], run_id: str | None, ok: bool) -> None:
    """Close the parent run as FINISHED or FAILED."""
    if not run_id or not config["tracking"]["enabled"]:
        return
    mlflow, _ = _mlflow(config)
    mlflow.MlflowClient().set_terminated(run_id, "FINISHED" if ok else "FAILED")


def _log_params(client: Any, run_id: str, params: Mapping[str, str]) -> None:
    from mlflow.entities import Param

    items = [Param(k, v[:6000]) for k, v in sorted(params.items())]
    for i in range(0, len(items), 100):
        client.log_batch(run_id, params=items[i : i + 100])


@dataclass
class StageRun:
    """Handle a stage uses to record metrics and artifacts (no-op when tracking is off)."""

    client: Any = None
    run_id: str | None = None

    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        if self.client is None:
            return
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k, float(v), now, step or 0) for k, v in sorted(metrics.items())]
        self.client.log_batch(self.run_id, metrics=batch)

    def log_metric_steps(self, steps: list[tuple[int, Mapping[str, float]]]) -> None:
        """Log many steps' metrics in few requests (per-step training metrics, buffered by the caller)."""
        if self.client is None or not steps:
            return
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k, float(v), now, step) for step, metrics in steps for k, v in sorted(metrics.items())]
        for i in range(0, len(batch), 1000):
            self.client.log_batch(self.run_id, metrics=batch[i : i + 1000])

    def log_params(self, params: Mapping[str, Any]) -> None:
        if self.client is not None:
            _log_params(self.client, self.run_id, {k: str(v) for k, v in params.items()})

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        if self.client is not None:
            for key, value in tags.items():
                self.client.set_tag(self.run_id, key, str(value))

    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        if self.client is not None and Path(path).exists():
            self.client.log_artifact(self.run_id, str(path), artifact_path)

    def log_dict(self, data: Mapping[str, Any], name: str) -> None:
        if self.client is None:
            return
        with tempfile.TemporaryDirectory() as tmp:
            target = Path(tmp) / name
            target.write_text(json.dumps(data, indent=2, sort_keys=True), encoding="utf-8")
            self.client.log_artifact(self.run_id, str(target))


@contextmanager
def stage_run(config: Mapping[str, Any], stage: str, parent_run_id: str | None = None,
              resolved_config: str | Path | None = None) -> Iterator[StageRun]:
    """Open a stage run nested under the pipeline run (from ``$ASRFLOW_PARENT_RUN_ID``).

    The run ends FINISHED, or FAILED if the stage raises (the exception propagates).
    """
    if not config["tracking"]["enabled"]:
        yield StageRun()
        return
    mlflow, experiment_id = _mlflow(config)
    client = mlflow.MlflowClient()
    parent = parent_run_id or os.environ.get(PARENT_ENV) or None
    env = environment_info()
    tags = {"asrflow.kind": "stage", "asrflow.stage": stage,
            **{f"asrflow.{k}": v for k, v in env.items()}, "mlflow.source.git.commit": env["git_commit"]}
    if parent:
        tags["mlflow.parentRunId"] = parent
    run = client.create_run(experiment_id, run_name=stage, tags=tags)
    handle = StageRun(client, run.info.run_id)
    _log_params(client, run.info.run_id, flatten(config))
    if resolved_config:
        handle.log_artifact(resolved_config)
    try:
        yield handle
    except BaseException:
        client.set_terminated(run.info.run_id, "FAILED")
        raise
    client.set_terminated(run.info.run_id, "FINISHED")
