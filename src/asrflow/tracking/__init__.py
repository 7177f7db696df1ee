"""MLflow tracking: the only module of asrflow that imports mlflow."""

from asrflow.tracking.mlflow_runs import (
    PARENT_ENV,
    BackgroundMetrics,
    StageRun,
    end_pipeline_run,
    environment_info,
    flatten,
    stage_run,
    start_pipeline_run,
    tracking_uri,
)

__all__ = [
    "PARENT_ENV",
    "BackgroundMetrics",
    "StageRun",
    "end_pipeline_run",
    "environment_info",
    "flatten",
    "start_pipeline_run",
    "stage_run",
    "tracking_uri",
]
