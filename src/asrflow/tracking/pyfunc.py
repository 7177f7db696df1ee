"""The MLflow pyfunc model of a trained network: ``predict`` transcribes wav files.

Load it with ``mlflow.pyfunc.load_model(uri)`` and call ``predict`` with a list of paths
or a DataFrame with a ``path`` column; it returns one transcript per file. With
``params={"one_speaker": True}`` the files are normalised as one speaker's recordings (their
joint CMVN statistics, as the decode stage does for a test speaker), otherwise with the
training speakers' pooled statistics. The artifacts
are the files of :func:`asrflow.nnet.transcribe.bundle_files` (network, settings and the
graph or LM), so the model works away from the results folder.
"""

from __future__ import annotations

from importlib import metadata
from typing import Any

import mlflow
from mlflow.models import ModelSignature
from mlflow.types import ParamSchema, ParamSpec

#: ``params`` of ``predict``: ``one_speaker`` True normalises the files with their own joint statistics (one
#: speaker's recordings, as the decode stage normalises a test speaker), False with the training speakers'.
SIGNATURE = ModelSignature(inputs=None, params=ParamSchema([ParamSpec("one_speaker", "boolean", False)]))


class TranscriberModel(mlflow.pyfunc.PythonModel):
    """pyfunc wrapper of :class:`asrflow.nnet.transcribe.Transcriber`."""

    def load_context(self, context: Any) -> None:
        from asrflow.nnet.transcribe import Transcriber

        self.transcriber = Transcriber(dict(context.artifacts))

    def predict(self, context, model_input, params=None):  # no type hints: MLflow would turn them into a schema
        if hasattr(model_input, "columns"):
            column = "path" if "path" in model_input.columns else model_input.columns[0]
            paths = [str(p) for p in model_input[column]]
        else:
            paths = [str(p) for p in model_input]
        return self.transcriber.transcribe(paths, one_speaker=bool((params or {}).get("one_speaker", False)))


def log_transcriber(run_id: str, files: dict[str, str], name: str = "model") -> str:
    """Log the pyfunc model into the run ``run_id`` (of the current tracking URI); returns its model URI."""
    requirements = [f"{pkg}=={metadata.version(pkg)}" for pkg in ("torch", "mlflow", "asrflow")]
    with mlflow.start_run(run_id=run_id):
        info = mlflow.pyfunc.log_model(name=name, python_model=TranscriberModel(), artifacts=files,
                                       pip_requirements=requirements, signature=SIGNATURE)
    return info.model_uri
