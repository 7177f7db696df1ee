"""Shared fixtures: the corpus mirror, generated audio, and resolved configs on tmp folders."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from asrflow.config import resolve_config
from asrflow.config.schema import merge

REPO = Path(__file__).resolve().parents[1]

#: test modules that start several processes per test (learners under torchrun): the slow tier with the workflow
SLOW_MODULES = ("tests/parallel/test_strategies.py",)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the slow tier: whole-workflow runs (marker ``workflow``, ``slurm``) and the multi-process modules.

    ``pytest -m "not slow"`` is the quick tier for the development loop; CI runs everything.
    """
    for item in items:
        module = Path(str(item.fspath)).resolve().relative_to(REPO).as_posix()
        if item.get_closest_marker("workflow") or module in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)


def mirror_path() -> Path | None:
    env = os.environ.get("ASRFLOW_DATA_MIRROR")
    return Path(env) if env and Path(env).is_dir() else None


@pytest.fixture(scope="session")
def mirror() -> Path:
    path = mirror_path()
    if path is None:
        message = "no corpus mirror: set ASRFLOW_DATA_MIRROR to a folder with the corpora (.ci/run finds CI's)"
        if os.environ.get("CI"):
            pytest.fail(message)  # CI always has the mirror: never let its tests skip silently
        pytest.skip(message)
    return path


@pytest.fixture()
def use_mirror(mirror: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ASRFLOW_DATA_MIRROR", str(mirror))
    return mirror


def tone(seconds: float, rate: int = 8000, freq: float = 440.0, seed: int = 0) -> np.ndarray:
    """A tone with a little noise (float32 in [-1, 1])."""
    t = np.arange(int(seconds * rate)) / rate
    rng = np.random.default_rng(seed)
    return (0.3 * np.sin(2 * np.pi * freq * t) + 0.01 * rng.standard_normal(t.size)).astype(np.float32)


def write_wav(path: Path, seconds: float = 0.5, rate: int = 8000, freq: float = 440.0) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    sf.write(path, tone(seconds, rate, freq), rate, subtype="PCM_16")
    return path


def make_config(tmp_path: Path, **sections) -> dict:
    """A resolved config whose results and downloads live under ``tmp_path``."""
    base = {
        "experiment": "test",
        "results_dir": str(tmp_path / "results"),
        "corpus": {"name": "yesno", "download_dir": str(tmp_path / "downloads")},
        "audio": {"sample_rate": 8000},
        "dask": {"workers": 1, "dashboard": False},
    }
    return resolve_config(merge(base, sections))


@pytest.fixture(scope="session")
def dask_client_1():
    """One shared single-worker LocalCluster for the library tests."""
    from asrflow.cluster import dask_client

    cfg = {"cluster": "local", "address": None, "workers": 1, "host": "127.0.0.1", "dashboard": False}
    with dask_client(cfg, log=lambda *_: None) as client:
        yield client


@pytest.fixture(scope="session")
def yesno_run(tmp_path_factory, mirror) -> Path:
    """The yesno experiment run locally (``snakemake --cores 2``): its working folder.

    yesno's jobs are mostly start-up (imports, a Dask cluster, MLflow) and tiny networks: each
    takes one core (``--set-threads``), so two run at once, and the GMM side, which the rules
    rank first, starts on the first free core instead of waiting for both. Results do not depend
    on the Dask worker count (the Slurm test compares this run with one whose GMM stages have two
    workers); the two-learner dnn has one thread per learner either way.
    """
    from tests.snakemake_run import YESNO, snakemake

    os.environ["ASRFLOW_DATA_MIRROR"] = str(mirror)
    workdir = tmp_path_factory.mktemp("workflow")
    snakemake(workdir, "--cores", "2", "--set-threads", "features=1", "gmm=1", "align=1", "fmllr=1", "nnet=1",
              "decode=1", "decode_nnet=1", "tune_nnet=1", "tune_gmm=1", "--configfile", str(YESNO))
    return workdir
