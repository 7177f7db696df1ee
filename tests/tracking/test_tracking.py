"""MLflow: a parent run per pipeline, nested stage runs with params, metrics, tags, artifacts."""

from __future__ import annotations

from pathlib import Path

import mlflow
import pytest
import yaml

from asrflow.cli import main
from asrflow.tracking import PARENT_ENV, end_pipeline_run, flatten, stage_run, start_pipeline_run, tracking_uri

from ..conftest import make_config


def _client(config: dict) -> mlflow.MlflowClient:
    return mlflow.MlflowClient(tracking_uri=tracking_uri(config))


def test_flatten() -> None:
    assert flatten({"a": {"b": 1, "c": [1, 2]}, "d": None}) == {"a.b": "1", "a.c": "[1, 2]", "d": "None"}


def test_default_uri_is_sqlite_under_results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    config = make_config(tmp_path)
    assert tracking_uri(config) == f"sqlite:///{tmp_path / 'results' / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:////elsewhere.db")
    assert tracking_uri(config) == "sqlite:////elsewhere.db"


def test_pipeline_and_stage_runs(tmp_path: Path, use_mirror, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    config = make_config(tmp_path, corpus={"name": "yesno"})
    resolved = tmp_path / "config.yaml"
    resolved.write_text(yaml.safe_dump(config))
    parent = start_pipeline_run(config)
    monkeypatch.setenv(PARENT_ENV, parent)
    assert main(["data", "--config", str(resolved), "--out", str(tmp_path / "data")]) == 0
    assert main(["features", "--config", str(resolved), "--data", str(tmp_path / "data"),
                 "--kind", "mfcc", "--out", str(tmp_path / "mfcc")]) == 0
    end_pipeline_run(config, parent, ok=True)

    client = _client(config)
    experiment = client.get_experiment_by_name("test")
    runs = client.search_runs([experiment.experiment_id])
    by_name = {r.info.run_name: r for r in runs}
    assert set(by_name) == {"pipeline", "data", "features-mfcc"}
    assert by_name["pipeline"].info.status == "FINISHED"
    data = by_name["data"]
    assert data.data.tags["mlflow.parentRunId"] == parent
    assert data.data.params["corpus.name"] == "yesno"
    assert data.data.params["features.mfcc.num_ceps"] == "13"
    assert data.data.metrics["utterances"] == 60 and data.data.metrics["rejected"] == 0
    assert data.data.metrics["hours"] > 0.1 and data.data.metrics["x_real_time"] > 0
    assert len(data.data.tags["asrflow.corpus_fingerprint"]) == 64
    assert data.data.tags["asrflow.version.mlflow"] == "3.17.2"
    assert "asrflow.git_commit" in data.data.tags
    artifacts = {a.path for a in client.list_artifacts(data.info.run_id)}
    assert {"report.tsv", "manifest.json", "config.yaml"} <= artifacts
    feats = by_name["features-mfcc"]
    assert feats.data.tags["mlflow.parentRunId"] == parent
    assert feats.data.metrics["frames"] > 30000 and feats.data.metrics["wall_seconds"] > 0
    assert feats.data.tags["asrflow.corpus_fingerprint"] == data.data.tags["asrflow.corpus_fingerprint"]
    cmvn = {a.path for a in client.list_artifacts(feats.info.run_id, "cmvn")}
    assert cmvn == {"cmvn/train", "cmvn/test"}


def test_failed_stage_is_marked_failed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv(PARENT_ENV, raising=False)
    config = make_config(tmp_path)
    with pytest.raises(RuntimeError), stage_run(config, "boom"):
        raise RuntimeError("stage failed")
    runs = _client(config).search_runs([_client(config).get_experiment_by_name("test").experiment_id])
    assert [r.info.status for r in runs] == ["FAILED"]


def test_tracking_can_be_disabled(tmp_path: Path) -> None:
    config = make_config(tmp_path, tracking={"enabled": False})
    assert start_pipeline_run(config) is None
    with stage_run(config, "quiet") as run:
        run.log_metrics({"x": 1})
    assert not (tmp_path / "results" / "mlflow.db").exists()
