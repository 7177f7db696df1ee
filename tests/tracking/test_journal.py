"""Stage runs journaled under a workflow and relayed to MLflow by one process (asrflow.tracking.journal)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import mlflow
import pytest
import yaml

from asrflow.tracking import tracking_uri
from asrflow.tracking.journal import SPOOL_ENV, Journal, Relay, relay

from ..conftest import make_config

PARENT = "0" * 32  # a parent run id as the workflow exports it

STAGE = """
import json, sys
from asrflow.tracking import stage_run
config = json.loads(sys.argv[1])
with stage_run(config, "probe", parent_run_id=sys.argv[2], resolved_config=sys.argv[3]) as run:
    run.set_tags({"asrflow.system": "dnn"})
    run.log_metrics({"wer": 0.25, "rejected (odd)": 2})
    run.log_metric_steps([(1, {"loss": 3.0}), (2, {"loss": 2.0})])
    run.log_dict({"a": 1}, "summary.json")
    print("mlflow imported:", "mlflow" in sys.modules)
"""


def _client(config: dict) -> mlflow.MlflowClient:
    return mlflow.MlflowClient(tracking_uri=tracking_uri(config))


def _runs(config: dict) -> dict[str, mlflow.entities.Run]:
    client = _client(config)
    experiment = client.get_experiment_by_name(config["experiment"])
    return {r.info.run_name: r for r in client.search_runs([experiment.experiment_id])} if experiment else {}


@pytest.fixture()
def config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return make_config(tmp_path)


def test_a_journaled_stage_imports_no_mlflow_and_the_relay_writes_its_whole_run(config: dict, tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    resolved = tmp_path / "config.yaml"
    resolved.write_text(yaml.safe_dump(config))
    env = {"PATH": "/usr/bin:/bin", SPOOL_ENV: str(spool)}
    started = int(time.time() * 1000)
    out = subprocess.run([sys.executable, "-c", STAGE, json.dumps(config), PARENT, str(resolved)], env=env,
                         capture_output=True, text=True, check=True).stdout
    assert "mlflow imported: False" in out  # the point: a stage under a workflow does not pay for MLflow
    resolved.unlink()  # the artifact was copied beside the journal when it was logged
    assert not _runs(config)  # nothing in MLflow before the relay

    counts = relay(config, spool)
    assert counts == {"runs": 1, "records": counts["records"], "ended": 1, "failed": 0}
    run = _runs(config)["probe"]
    assert run.info.status == "FINISHED" and started <= run.info.start_time <= run.info.end_time
    assert run.data.tags["mlflow.parentRunId"] == PARENT and run.data.tags["asrflow.stage"] == "probe"
    assert run.data.tags["asrflow.system"] == "dnn"
    assert run.data.params["experiment"] == "test" and run.data.params["dask.workers"] == "1"
    assert run.data.metrics["wer"] == 0.25 and run.data.metrics["rejected _odd_"] == 2
    history = _client(config).get_metric_history(run.info.run_id, "loss")
    assert [(m.step, m.value) for m in history] == [(1, 3.0), (2, 2.0)]
    assert {a.path for a in _client(config).list_artifacts(run.info.run_id)} == {"config.yaml", "summary.json"}
    assert not list(spool.glob("*.jsonl")) and not list(spool.glob("*.artifacts"))  # relayed: removed
    assert relay(config, spool)["records"] == 0 and len(_runs(config)) == 1  # nothing written twice


def _journal(spool: Path, parent: str = PARENT) -> Journal:
    journal = Journal(spool, "stage")
    journal.record("start", name="stage", tags={"mlflow.parentRunId": parent}, time=int(time.time() * 1000),
                   experiment="test")
    return journal


def test_the_relay_goes_on_where_it_stopped(config: dict, tmp_path: Path) -> None:
    """A running stage's records arrive as they are written, each once; a half-written line waits."""
    spool = tmp_path / "spool"
    journal = _journal(spool)
    journal.record("metrics", items=[["loss", 3.0, 1, 1]])
    with open(journal.path, "a") as f:
        f.write('{"op": "metrics", "items": [["loss", 2.0, 2, 2]]')  # no newline yet: still being written
    assert relay(config, spool)["records"] == 2
    run = _runs(config)["stage"]
    assert run.info.status == "RUNNING" and run.data.metrics["loss"] == 3.0
    with open(journal.path, "a") as f:
        f.write("}\n")
    journal.record("end", status="FINISHED", time=int(time.time() * 1000))
    assert relay(config, spool) == {"runs": 0, "records": 2, "ended": 1, "failed": 0}
    history = _client(config).get_metric_history(run.info.run_id, "loss")
    assert [(m.step, m.value) for m in history] == [(1, 3.0), (2, 2.0)]
    assert _runs(config)["stage"].info.status == "FINISHED"


def test_a_killed_stage_ends_failed_when_its_workflow_ends(config: dict, tmp_path: Path) -> None:
    from asrflow.tracking import start_pipeline_run

    spool = tmp_path / "spool"
    parent = start_pipeline_run(config)
    journal = _journal(spool, parent)
    relay(config, spool, ended="another workflow")  # not this one's, which still runs: so may the stage
    assert _runs(config)["stage"].info.status == "RUNNING" and journal.path.is_file()
    assert relay(config, spool, ended=parent)["ended"] == 1
    assert _runs(config)["stage"].info.status == "FAILED" and not journal.path.exists()


def test_a_stage_left_by_an_earlier_workflow_ends_with_the_next_one(config: dict, tmp_path: Path) -> None:
    """A workflow killed before its onerror handler leaves a stage's journal without an end; it ends FAILED
    when a later workflow in the same folder ends, since its own parent run is no longer running."""
    from asrflow.tracking import end_pipeline_run, start_pipeline_run

    spool = tmp_path / "spool"
    earlier, running = start_pipeline_run(config), start_pipeline_run(config)
    left, alive = _journal(spool, parent=earlier), Journal(spool, "other")
    alive.record("start", name="other", tags={"mlflow.parentRunId": running}, time=1, experiment="test")
    end_pipeline_run(config, earlier, ok=False)
    assert relay(config, spool, ended="a third workflow")["ended"] == 1
    assert _runs(config)["stage"].info.status == "FAILED" and not left.path.exists()
    assert _runs(config)["other"].info.status == "RUNNING" and alive.path.is_file()  # its workflow runs on


def test_a_value_the_store_refuses_is_skipped_with_a_warning(config: dict, tmp_path: Path, capsys) -> None:
    spool = tmp_path / "spool"
    journal = _journal(spool)
    journal.record("params", items={"a": "1"})
    journal.record("params", items={"a": "2"})  # MLflow keeps a parameter's first value
    journal.record("tags", items={"b": "3"})
    journal.record("end", status="FINISHED", time=int(time.time() * 1000))
    assert relay(config, spool)["failed"] == 0
    run = _runs(config)["stage"]
    assert run.data.params["a"] == "1" and run.data.tags["b"] == "3" and run.info.status == "FINISHED"
    assert "warning: MLflow tracking failed" in capsys.readouterr().err


def test_a_store_that_cannot_be_opened_keeps_the_journals(tmp_path: Path, capsys) -> None:
    (tmp_path / "a_file").write_text("")
    config = make_config(tmp_path, tracking={"uri": f"sqlite:///{tmp_path}/a_file/mlflow.db"})  # cannot be made
    spool = tmp_path / "spool"
    journal = _journal(spool)
    assert relay(config, spool)["failed"] == 1  # a warning, never an exception
    assert "warning: MLflow tracking failed (relaying the stages' runs" in capsys.readouterr().err
    assert journal.path.is_file()


def test_the_relay_thread_writes_while_the_workflow_runs_and_clears_the_spool(config: dict, tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    thread = Relay(config, spool, PARENT, every=0.1)
    journal = _journal(spool)
    for _ in range(100):
        if "stage" in _runs(config):
            break
        time.sleep(0.1)
    assert _runs(config)["stage"].info.status == "RUNNING"  # relayed by the thread, the stage still running
    journal.record("end", status="FINISHED", time=int(time.time() * 1000))
    thread.stop()
    assert _runs(config)["stage"].info.status == "FINISHED" and not spool.exists()
