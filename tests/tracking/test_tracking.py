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
    for run in (data, feats):  # every Dask stage records what its driver and workers needed
        assert run.data.metrics["peak_rss_driver_mb"] > 10 and run.data.metrics["peak_rss_worker_mb"] > 10
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


def test_names_mlflow_refuses_are_made_into_ones_it_takes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A metric or tag name with characters MLflow refuses (a rejection reason) is logged under a sanitised
    name instead of failing the stage."""
    from asrflow.tracking.mlflow_runs import key_name

    assert key_name("rejected.audio file is empty (0 bytes)") == "rejected.audio file is empty _0 bytes_"
    assert key_name("split.train_sp.utterances") == "split.train_sp.utterances"
    assert key_name("rejected.bad: ~line* «7»") == "rejected.bad_ _line_ _7_"
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv(PARENT_ENV, raising=False)
    config = make_config(tmp_path)
    with stage_run(config, "odd") as run:
        run.log_metrics({"rejected.audio file is empty (0 bytes)": 3, "rejected.why?! (yes: «this»)": 1})
        run.set_tags({"asrflow.reason (why)": "x"})
    (only,) = _client(config).search_runs([_client(config).get_experiment_by_name("test").experiment_id])
    assert only.info.status == "FINISHED"
    assert only.data.metrics["rejected.audio file is empty _0 bytes_"] == 3
    assert only.data.tags["asrflow.reason _why_"] == "x"


def test_an_unreachable_tracking_server_is_a_warning(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture) -> None:
    """A tracking server nobody answers at: the pipeline and the stage run without tracking, with a warning."""
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    monkeypatch.delenv(PARENT_ENV, raising=False)
    config = make_config(tmp_path, tracking={"uri": f"http://127.0.0.1:{port}"})
    assert start_pipeline_run(config) is None
    done = []
    with stage_run(config, "offline") as run:
        run.log_metrics({"x": 1.0})
        run.log_artifact(tmp_path)
        done.append(True)
    end_pipeline_run(config, "no-such-run", ok=True)
    assert done == [True]
    err = capsys.readouterr().err
    assert "asrflow: warning: MLflow tracking failed (opening the pipeline run" in err
    assert "asrflow: warning: MLflow tracking failed (opening the offline run" in err


def test_a_data_stage_that_rejects_everything_leaves_its_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture) -> None:
    """Every utterance rejected: the stage fails naming the report that stays outside its output folder
    (which a workflow manager removes), and MLflow counts the rejections under names it accepts."""
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv(PARENT_ENV, raising=False)
    data = tmp_path / "corpus" / "train"
    data.mkdir(parents=True)
    (tmp_path / "corpus" / "empty.wav").write_bytes(b"")
    (data / "wav.scp").write_text("u1 empty.wav\nu2 missing.wav\n")
    (data / "text").write_text("u1 hello\nu2 there\n")
    (data / "utt2spk").write_text("u1 s\nu2 s\n")
    config = make_config(tmp_path, corpus={"name": "kaldi_dir", "path": str(tmp_path / "corpus")})
    resolved = tmp_path / "config.yaml"
    resolved.write_text(yaml.safe_dump(config))
    kept = tmp_path / "logs" / "data.report.tsv"
    assert main(["data", "--config", str(resolved), "--out", str(tmp_path / "data"), "--report", str(kept)]) == 1
    assert f"the reasons are in {kept}" in capsys.readouterr().err
    rows = kept.read_text().splitlines()
    assert rows[0] == "utt_id\tfile\treason" and len(rows) == 3
    assert "audio file is empty (0 bytes)" in rows[1] and "audio file not found" in rows[2]
    (run,) = _client(config).search_runs([_client(config).get_experiment_by_name("test").experiment_id])
    assert run.info.status == "FAILED" and run.data.metrics["rejected"] == 2
    assert run.data.metrics["rejected.audio_file_is_empty_0_bytes_"] == 1


def test_training_metrics_are_written_off_the_loop_and_all_arrive(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """BackgroundMetrics: the caller only appends; a thread writes every 25 steps and at each held-out loss;
    close() writes the rest, so every step's metrics reach the store."""
    import threading

    from asrflow.tracking import BackgroundMetrics

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv(PARENT_ENV, raising=False)
    config = make_config(tmp_path)
    writers: set[str] = set()
    with stage_run(config, "train") as run:
        write = run.log_metric_steps

        def recording(steps):
            writers.add(threading.current_thread().name)
            write(steps)

        monkeypatch.setattr(run, "log_metric_steps", recording)
        metrics = BackgroundMetrics(run)
        for step in range(1, 61):
            metrics(step, {"loss": 1.0 / step, **({"valid_loss": 0.5} if step == 30 else {})})
        metrics.close()
        run_id = run.run_id
    history = _client(config).get_metric_history(run_id, "loss")
    assert sorted(m.step for m in history) == list(range(1, 61))
    assert writers == {"mlflow-metrics"}
