"""GMM training on Dask: the same model with 1 or 2 workers, and when a worker dies mid E-step."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from asrflow.cluster import dask_client
from asrflow.data.stage import prepare_data
from asrflow.features.stage import extract_features
from asrflow.gmm.shards import split_shards
from asrflow.gmm.train import train_mono
from asrflow.lang.stage import prepare_lang

from ..conftest import make_config

QUIET = lambda *_: None  # noqa: E731
SMALL = {"mono": {"iterations": 6, "realign_iterations": [1, 2, 4], "gaussians": 120, "max_iter_inc": 4}}


@pytest.fixture(scope="module")
def yesno(tmp_path_factory, mirror, dask_client_1):
    tmp = tmp_path_factory.mktemp("gmm")
    os.environ["ASRFLOW_DATA_MIRROR"] = str(mirror)
    config = make_config(tmp, corpus={"name": "yesno"}, features={"kinds": ["mfcc"]}, gmm=SMALL)
    prepare_data(config, tmp / "data", dask_client_1, log=QUIET)
    extract_features(config, tmp / "data", "mfcc", tmp / "mfcc", dask_client_1, log=QUIET)
    prepare_lang(config, tmp / "data", "train", ["test"], tmp / "lang", log=QUIET)
    shards = split_shards(tmp / "data", tmp / "mfcc", tmp / "lang", "train", 4)
    return config, shards, tmp / "lang"


def _train(config, shards, lang, client):
    steps: list[tuple[int, dict]] = []
    result = train_mono(config, shards, lang, client, lambda i, m: steps.append((i, m)), QUIET)
    return result, steps


def _two_workers():
    cfg = {"cluster": "local", "address": None, "workers": 2, "host": "127.0.0.1", "dashboard": False}
    return dask_client(cfg, log=QUIET)


def test_mono_trains_and_logs_each_iteration(yesno, dask_client_1) -> None:
    config, shards, lang = yesno
    result, steps = _train(config, shards, lang, dask_client_1)
    assert [i for i, _ in steps] == list(range(6))
    likes = [m["loglike_per_frame"] for _, m in steps]
    assert likes[-1] > likes[1]  # training improves the likelihood
    assert steps[-1][1]["gaussians"] > steps[0][1]["gaussians"] == result.model.am.num_pdfs
    assert len(result.alignments) == 31 and not result.failed


def test_same_model_with_two_workers_and_a_killed_worker(yesno, dask_client_1) -> None:
    config, shards, lang = yesno
    reference, _ = _train(config, shards, lang, dask_client_1)
    with _two_workers() as client:
        pids = client.run(os.getpid)
        out: dict = {}

        def run() -> None:
            try:
                out["result"] = _train(config, shards, lang, client)[0]
            except BaseException as exc:  # surfaced below
                out["error"] = exc

        thread = threading.Thread(target=run)
        thread.start()
        killed = None
        deadline = time.monotonic() + 120
        # Kill the first worker seen running a realigning E-step after the flat start.
        while killed is None and thread.is_alive() and time.monotonic() < deadline:
            busy = [w for w, keys in client.processing().items()
                    if any(str(k).startswith(("iter1-", "iter2-", "iter4-")) for k in keys)]
            if busy:
                killed = busy[0]
                os.kill(pids[killed], signal.SIGKILL)
            time.sleep(0.001)
        thread.join(timeout=300)
        assert killed is not None, "no E-step was seen running"
    assert "error" not in out, repr(out.get("error"))
    result = out["result"]
    assert result.model.to_bytes() == reference.model.to_bytes()
    assert result.alignments.keys() == reference.alignments.keys()
    assert all((result.alignments[u] == reference.alignments[u]).all() for u in reference.alignments)
