"""One MLflow parent run per pipeline invocation, one nested run per stage.

The Snakefile's ``onstart`` handler opens the parent run and exports its id in
``$ASRFLOW_PARENT_RUN_ID``; every stage (a separate process, maybe on another node) opens a
run tagged with that parent. Every run carries the resolved config as params, the git
commit, package versions and, for stages, their metrics and artifacts.

Default store: ``sqlite:///<results_dir>/mlflow.db`` with artifacts in
``<results_dir>/mlartifacts``; ``$MLFLOW_TRACKING_URI`` or ``tracking.uri`` override it.

Tracking never takes a stage down: a store that cannot be reached, or a value it refuses, is a
warning on stderr, after which that run records nothing more (the stage and its outputs go on).
Metric and parameter names are made of the characters MLflow accepts (:func:`key_name`).
"""

from __future__ import annotations

import functools
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from asrflow.tracking.journal import SPOOL_ENV, Journal, now_ms

PARENT_ENV = "ASRFLOW_PARENT_RUN_ID"
_PACKAGES = ("asrflow", "torch", "mlflow", "snakemake", "dask", "distributed",
             "numpy", "soundfile", "soxr", "kaldiio", "sentencepiece", "num2words")


#: characters MLflow refuses in metric, parameter and tag names (it takes letters, digits, _ - . space /)
_REFUSED = re.compile(r"[^A-Za-z0-9_\-. /]")


def key_name(name: str) -> str:
    """``name`` as an MLflow key: each refused character becomes ``_``, runs of them one ``_``, so that a
    reason such as ``audio file is empty (0 bytes)`` gives ``audio file is empty _0 bytes_``."""
    return re.sub(r"_+", "_", _REFUSED.sub("_", name)) if _REFUSED.search(name) else name


def warn(what: str, exc: BaseException) -> None:
    """Say on stderr that tracking failed, and that the stage goes on without it."""
    print(f"asrflow: warning: MLflow tracking failed ({what}: {type(exc).__name__}: {exc}); "
          f"the stage goes on without tracking", file=sys.stderr, flush=True)


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
    try:
        mlflow, experiment_id = _mlflow(config)
        client = mlflow.MlflowClient()
        env = environment_info()
        run = client.create_run(experiment_id, run_name=name,
                                tags={"asrflow.kind": "pipeline", **{f"asrflow.{k}": v for k, v in env.items()},
                                      "mlflow.source.git.commit": env["git_commit"]})
        _log_params(client, run.info.run_id, flatten(config))
    except Exception as exc:  # tracking must never stop the pipeline
        warn("opening the pipeline run", exc)
        return None
    return run.info.run_id


def end_pipeline_run(config: Mapping[str, Any], run_id: str | None, ok: bool) -> None:
    """Close the parent run as FINISHED or FAILED."""
    if not run_id or not config["tracking"]["enabled"]:
        return
    try:
        mlflow, _ = _mlflow(config)
        mlflow.MlflowClient().set_terminated(run_id, "FINISHED" if ok else "FAILED")
    except Exception as exc:  # tracking must never stop the pipeline
        warn("closing the pipeline run", exc)


def _log_params(client: Any, run_id: str, params: Mapping[str, str]) -> None:
    from mlflow.entities import Param

    items = [Param(key_name(k), str(v)[:6000]) for k, v in sorted(params.items())]
    for i in range(0, len(items), 100):
        client.log_batch(run_id, params=items[i : i + 100])


def _guarded(method):
    """A :class:`StageRun` method whose failure is a warning, after which the run records nothing more."""
    @functools.wraps(method)
    def wrapper(self: StageRun, *args: Any, **kwargs: Any) -> Any:
        if self.recorder is None:
            return None
        try:
            return method(self, *args, **kwargs)
        except Exception as exc:  # tracking must never stop a stage
            warn(method.__name__, exc)
            self.recorder = None
            return None
    return wrapper


class LiveRecorder:
    """Writes one run's records to MLflow: what a stage logs outside a workflow, and what the workflow's relay
    reads from the stages' journals (:mod:`asrflow.tracking.journal`). Metrics are ``[key, value, time, step]``."""

    def __init__(self, client: Any, run_id: str) -> None:
        self.client, self.run_id = client, run_id

    @classmethod
    def of(cls, config: Mapping[str, Any], run_id: str) -> LiveRecorder:
        """A recorder of the existing run ``run_id`` in the store of ``config``."""
        import mlflow

        mlflow.set_tracking_uri(tracking_uri(config))  # a model is logged through the fluent API
        return cls(mlflow.MlflowClient(), run_id)

    def apply(self, op: str, fields: Mapping[str, Any]) -> None:
        """Write one journal record (``op``: metrics, params, tags, artifact, model or end)."""
        getattr(self, op)(**fields)

    def metrics(self, items: list[list]) -> None:
        from mlflow.entities import Metric

        batch = [Metric(key, float(value), stamp, step) for key, value, stamp, step in items]
        for i in range(0, len(batch), 1000):
            self.client.log_batch(self.run_id, metrics=batch[i : i + 1000])

    def params(self, items: Mapping[str, str]) -> None:
        _log_params(self.client, self.run_id, items)

    def tags(self, items: Mapping[str, str]) -> None:
        for key, value in items.items():
            self.client.set_tag(self.run_id, key, value)

    def artifact(self, path: str, artifact_path: str | None = None) -> None:
        if Path(path).exists():
            self.client.log_artifact(self.run_id, path, artifact_path)

    def model(self, files: Mapping[str, str], name: str) -> str:
        from asrflow.tracking.pyfunc import log_transcriber

        return log_transcriber(self.run_id, dict(files), name)

    def end(self, status: str, time: int | None = None) -> None:
        self.client.set_terminated(self.run_id, status, end_time=time)


class JournalRecorder:
    """Appends one run's records to its journal, for the workflow's relay to write to MLflow: no MLflow here.
    Artifacts are copied beside the journal when logged."""

    run_id = None  # the relay gives the run its id

    def __init__(self, journal: Journal) -> None:
        self.journal = journal

    def metrics(self, items: list[list]) -> None:
        self.journal.record("metrics", items=items)

    def params(self, items: Mapping[str, str]) -> None:
        self.journal.record("params", items=dict(items))

    def tags(self, items: Mapping[str, str]) -> None:
        self.journal.record("tags", items=dict(items))

    def artifact(self, path: str, artifact_path: str | None = None) -> None:
        if Path(path).exists():
            self.journal.record("artifact", path=str(self.journal.copy(path)), artifact_path=artifact_path)

    def model(self, files: Mapping[str, str], name: str) -> None:
        self.journal.record("model", files={k: str(Path(v).resolve()) for k, v in files.items()}, name=name)

    def end(self, status: str, time: int | None = None) -> None:
        self.journal.record("end", status=status, time=time or now_ms())


@dataclass
class StageRun:
    """Handle a stage uses to record metrics and artifacts (no-op when tracking is off or has failed)."""

    recorder: LiveRecorder | JournalRecorder | None = None

    @property
    def run_id(self) -> str | None:
        """The MLflow run's id; None when tracking is off or the run is journaled (the relay opens it)."""
        return self.recorder.run_id if self.recorder is not None else None

    @_guarded
    def log_metrics(self, metrics: Mapping[str, float], step: int | None = None) -> None:
        stamp = now_ms()
        self.recorder.metrics([[key_name(k), float(v), stamp, step or 0] for k, v in sorted(metrics.items())])

    @_guarded
    def log_metric_steps(self, steps: list[tuple[int, Mapping[str, float]]]) -> None:
        """Log many steps' metrics in few requests (per-step training metrics, buffered by the caller)."""
        if steps:
            stamp = now_ms()
            self.recorder.metrics([[key_name(k), float(v), stamp, step] for step, metrics in steps
                                   for k, v in sorted(metrics.items())])

    @_guarded
    def log_params(self, params: Mapping[str, Any]) -> None:
        self.recorder.params({key_name(k): str(v) for k, v in params.items()})

    @_guarded
    def set_tags(self, tags: Mapping[str, Any]) -> None:
        self.recorder.tags({key_name(k): str(v) for k, v in tags.items()})

    @_guarded
    def log_artifact(self, path: str | Path, artifact_path: str | None = None) -> None:
        self.recorder.artifact(str(path), artifact_path)

    @_guarded
    def log_dict(self, data: Mapping[str, Any], name: str) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            target = Path(tmp) / name
            target.write_text(json.dumps(data, indent=2, sort_keys=True), encoding="utf-8")
            self.recorder.artifact(str(target))

    @_guarded
    def log_model(self, files: Mapping[str, str], name: str = "model") -> str | None:
        """Log the pyfunc transcriber of ``files`` (:mod:`asrflow.tracking.pyfunc`): its model URI, or None
        when the run is journaled (the relay logs it) or tracking is off."""
        return self.recorder.model(files, name)


class BackgroundMetrics:
    """Per-step metrics buffered and written to a :class:`StageRun` by a background thread, so a training loop
    never waits for the tracking store: every ``every`` steps (and with any step that has ``flush_on``) the
    buffer is handed to the thread; :meth:`close` writes what is left and waits for it."""

    def __init__(self, run: StageRun, every: int = 25, flush_on: str = "valid_loss") -> None:
        import queue
        import threading

        self.run, self.every, self.flush_on = run, every, flush_on
        self.pending: list[tuple[int, Mapping[str, float]]] = []
        self.queue: queue.Queue = queue.Queue()
        self.thread = threading.Thread(target=self._write, name="mlflow-metrics", daemon=True)
        self.thread.start()

    def _write(self) -> None:
        while (steps := self.queue.get()) is not None:
            self.run.log_metric_steps(steps)  # guarded: a failing store is a warning

    def __call__(self, step: int, metrics: Mapping[str, float]) -> None:
        self.pending.append((step, dict(metrics)))
        if len(self.pending) >= self.every or self.flush_on in metrics:
            self.queue.put(self.pending)
            self.pending = []

    def close(self) -> None:
        """Write the rest and wait for the thread."""
        if self.pending:
            self.queue.put(self.pending)
            self.pending = []
        self.queue.put(None)
        self.thread.join()


@contextmanager
def stage_run(config: Mapping[str, Any], stage: str, parent_run_id: str | None = None,
              resolved_config: str | Path | None = None) -> Iterator[StageRun]:
    """Open a stage run nested under the pipeline run (from ``$ASRFLOW_PARENT_RUN_ID``).

    The run ends FINISHED, or FAILED if the stage raises (the exception propagates). A store that
    cannot be reached gives a warning and a handle that records nothing; the stage runs all the same.
    """
    handle = _open_stage_run(config, stage, parent_run_id, resolved_config) if config["tracking"]["enabled"] \
        else StageRun()
    try:
        yield handle
    except BaseException:
        _close(handle, "FAILED")
        raise
    _close(handle, "FINISHED")


def open_run(config: Mapping[str, Any], name: str, tags: Mapping[str, str], time: int | None = None,
             experiment: str | None = None) -> LiveRecorder:
    """A new run ``name`` with ``tags`` in ``experiment`` (the config's by default), started at ``time`` (ms)."""
    mlflow, experiment_id = _mlflow({**config, "experiment": experiment or config["experiment"]})
    client = mlflow.MlflowClient()
    run = client.create_run(experiment_id, start_time=time, run_name=name, tags=dict(tags))
    return LiveRecorder(client, run.info.run_id)


def _open_stage_run(config: Mapping[str, Any], stage: str, parent_run_id: str | None,
                    resolved_config: str | Path | None) -> StageRun:
    """A handle on a new stage run — journaled under a workflow (``$ASRFLOW_TRACKING_SPOOL``), else in MLflow —
    or a no-op handle (with a warning) when that fails."""
    parent = parent_run_id or os.environ.get(PARENT_ENV) or None
    env = environment_info()
    tags = {"asrflow.kind": "stage", "asrflow.stage": stage,
            **{f"asrflow.{k}": v for k, v in env.items()}, "mlflow.source.git.commit": env["git_commit"]}
    if parent:
        tags["mlflow.parentRunId"] = parent
    try:
        if os.environ.get(SPOOL_ENV):
            journal = Journal(os.environ[SPOOL_ENV], stage)
            journal.record("start", name=stage, tags=tags, time=now_ms(), experiment=config["experiment"])
            recorder: LiveRecorder | JournalRecorder = JournalRecorder(journal)
        else:
            recorder = open_run(config, stage, tags)
    except Exception as exc:  # tracking must never stop a stage
        warn(f"opening the {stage} run", exc)
        return StageRun()
    handle = StageRun(recorder)
    handle.log_params(flatten(config))
    if resolved_config:
        handle.log_artifact(resolved_config)
    return handle


def _close(handle: StageRun, status: str) -> None:
    """End the run of ``handle`` with ``status`` (a warning if the store fails)."""
    if handle.recorder is None:
        return
    try:
        handle.recorder.end(status)
    except Exception as exc:  # tracking must never stop a stage
        warn("closing the run", exc)
