"""Read an experiment's stage runs back from MLflow as plain records (for ``asrflow compare``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class RunRecord:
    """One finished stage run: its stage name, tags, params, final metrics and start time (ms)."""

    run_id: str
    stage: str
    start_time: int
    tags: dict[str, str]
    params: dict[str, str]
    metrics: dict[str, float]


def _client(uri: str | None):
    import mlflow

    return mlflow.MlflowClient(tracking_uri=uri)


def stage_runs(uri: str, experiment: str) -> list[RunRecord]:
    """Finished stage runs of ``experiment`` (every rerun included), newest first."""
    client = _client(uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        raise FileNotFoundError(f"no MLflow experiment named {experiment!r} at {uri}")
    records: list[RunRecord] = []
    token = None
    query = "tags.`asrflow.kind` = 'stage' and attributes.status = 'FINISHED'"
    while True:
        page = client.search_runs([found.experiment_id], query, order_by=["attributes.start_time DESC"],
                                  max_results=1000, page_token=token)
        records += [RunRecord(run.info.run_id, run.data.tags.get("asrflow.stage", ""), run.info.start_time,
                              dict(run.data.tags), dict(run.data.params), dict(run.data.metrics)) for run in page]
        token = page.token
        if not token:
            return records


def run_record(uri: str | None, run_id: str) -> RunRecord:
    """One run by id (``uri`` None: MLflow's default, e.g. ``MLFLOW_TRACKING_URI``)."""
    run = _client(uri).get_run(run_id)
    return RunRecord(run.info.run_id, run.data.tags.get("asrflow.stage", ""), run.info.start_time,
                     dict(run.data.tags), dict(run.data.params), dict(run.data.metrics))


def metric_history(uri: str, run_id: str, names: tuple[str, ...]) -> dict[str, list[tuple[int, float]]]:
    """Step histories ``[(step, value)]`` of some metrics of one run."""
    client = _client(uri)
    return {name: [(m.step, m.value) for m in client.get_metric_history(run_id, name)] for name in names}


def latest_by_stage(records: list[RunRecord]) -> dict[str, RunRecord]:
    """The newest finished run of each stage name (reruns replace older ones)."""
    out: dict[str, RunRecord] = {}
    for record in sorted(records, key=lambda r: r.start_time):
        out[record.stage] = record
    return out
