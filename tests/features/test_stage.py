"""The features stage on Dask: identical output whatever the workers, even when one dies."""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from pathlib import Path

import kaldiio
import numpy as np
import pytest

from asrflow.cluster import dask_client
from asrflow.data.stage import prepare_data
from asrflow.features.stage import extract_features

from ..conftest import make_config

QUIET = dict(log=lambda *_: None)


def _tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file() and p.name != "timing.json"}


def _two_workers():
    cfg = {"cluster": "local", "address": None, "workers": 2, "host": "127.0.0.1", "dashboard": False}
    return dask_client(cfg, **QUIET)


@pytest.fixture(scope="module")
def yesno_data(tmp_path_factory, mirror, dask_client_1):
    tmp = tmp_path_factory.mktemp("yesno")
    os.environ["ASRFLOW_DATA_MIRROR"] = str(mirror)
    config = make_config(tmp, corpus={"name": "yesno"}, features={"shard_utts": 7, "compress": True})
    prepare_data(config, tmp / "data", dask_client_1, **QUIET)
    return config, tmp


def test_output_contract(yesno_data, dask_client_1) -> None:
    config, tmp = yesno_data
    out = tmp / "mfcc"
    summary = extract_features(config, tmp / "data", "mfcc", out, dask_client_1, **QUIET)
    assert summary.utterances == 60 and summary.failed == 0 and summary.shards == 9
    feats = dict(kaldiio.load_scp(str(out / "feats.scp")).items())
    assert len(feats) == 60 and all(m.shape[1] == 13 for m in feats.values())
    train = dict(kaldiio.load_scp(str(out / "train" / "feats.scp")).items())
    assert len(train) == 31
    cmvn = dict(kaldiio.load_scp(str(out / "train" / "cmvn.scp")).items())
    assert list(cmvn) == ["global"] and cmvn["global"].shape == (2, 14)
    frames = sum(m.shape[0] for k, m in feats.items() if k in train)
    assert cmvn["global"][0, -1] == frames
    np.testing.assert_allclose(cmvn["global"][0, :-1], sum(train[k].astype(float).sum(0) for k in train), rtol=1e-6)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["dim"] == 13 and manifest["splits"] == ["train", "test"]
    # stored as Kaldi's compressed matrices (features.compress); the CMVN above is of what is stored
    ark, offset = next(iter(feats_scp_values(out))).rsplit(":", 1)
    with open(ark, "rb") as f:
        f.seek(int(offset))
        assert f.read(5) == b"\0BCM "


def feats_scp_values(folder: Path) -> list[str]:
    return [line.split(maxsplit=1)[1] for line in (folder / "feats.scp").read_text().splitlines()]


def test_identical_with_one_or_two_workers(yesno_data, dask_client_1) -> None:
    config, tmp = yesno_data
    out = tmp / "fbank"
    extract_features(config, tmp / "data", "fbank", out, dask_client_1, **QUIET)
    one = _tree(out)
    shutil.rmtree(out)
    with _two_workers() as client:
        extract_features(config, tmp / "data", "fbank", out, client, workers=2, **QUIET)
    assert _tree(out) == one


def test_worker_killed_mid_stage(tmp_path: Path, use_mirror, dask_client_1) -> None:
    """SIGKILL a busy worker mid-stage: the stage completes, byte-identical to an undisturbed run."""
    config = make_config(tmp_path, corpus={"name": "fsdd"}, features={"shard_utts": 20, "kinds": ["mfcc"]})
    prepare_data(config, tmp_path / "data", dask_client_1, **QUIET)
    out = tmp_path / "mfcc"
    extract_features(config, tmp_path / "data", "mfcc", out, dask_client_1, **QUIET)
    reference = _tree(out)
    shutil.rmtree(out)
    total = len([k for k in reference if k.endswith(".ark") and "/" not in k])
    with _two_workers() as client:
        pids = client.run(os.getpid)
        errors: list[BaseException] = []

        def run() -> None:
            try:
                extract_features(config, tmp_path / "data", "mfcc", out, client, workers=2, **QUIET)
            except BaseException as exc:  # surfaced below
                errors.append(exc)

        thread = threading.Thread(target=run)
        thread.start()
        deadline = time.monotonic() + 60
        victim = None
        while victim is None and time.monotonic() < deadline:
            done = len(list(out.glob("feats.*.ark"))) if out.exists() else 0
            busy = [w for w, keys in client.processing().items() if keys]
            if done >= 3 and busy:
                victim = busy[0]
                done_at_kill = done
                os.kill(pids[victim], signal.SIGKILL)
            time.sleep(0.002)
        thread.join(timeout=120)
        assert victim is not None, "never saw a busy worker to kill"
        assert done_at_kill < total, "the stage had finished before the kill"
        assert not errors, errors
        assert victim not in client.scheduler_info()["workers"] or pids[victim] != client.run(os.getpid).get(victim)
    assert _tree(out) == reference
    assert not list(out.glob(".*.tmp"))
