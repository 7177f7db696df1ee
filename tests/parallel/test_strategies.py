"""Every parallel strategy trains a tiny model with real learner processes under torchrun (gloo on loopback)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.nnet.helpers import free_port
from tests.nnet.test_data import fbank  # noqa: F401  (module fixture: yesno fbank features)

# one pytest-xdist worker runs the whole module: its learners' runs (a module fixture) are computed once
pytestmark = pytest.mark.xdist_group("strategies")

SCRIPT = """
import json, sys
from pathlib import Path
import numpy as np
from asrflow.nnet.data import FeatureDataset
from asrflow.config.settings import Training
from asrflow.nnet.train import train
from asrflow.config.settings import Parallel
from asrflow.data.datadir import read_table

root, out, runs = Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3])
hooks = runs.pop("_test", {})
if hooks.get("stall_rank") is not None:  # a learner that hangs in its computation
    import os, time
    from asrflow.parallel.base import Strategy
    begin = Strategy.begin_step
    def stalling(self):
        begin(self)
        if self.rank == hooks["stall_rank"] and self.step == 3:
            time.sleep(600)
    Strategy.begin_step = stalling
frames = {u: int(n) for u, n in read_table(root / "fbank" / "train" / "utt2num_frames").items()}
targets = {u: (np.arange(n) * 4 // n) for u, n in frames.items()}  # 4 classes by position in the utterance
data = FeatureDataset(root / "data", root / "fbank", "train", targets)
opts = Training.defaults(epochs=hooks.get("epochs", 5), max_frames=1000, lr=3e-3, warmup_steps=5,
                         checkpoint_every=4, checkpoint_minutes=0, patience=50, seed=3)
for name, settings in runs.items():
    summary = train({"type": "dnn", "hidden": 48, "layers": 2, "context": 2, "dropout": 0.0}, opts, data, data, 4,
                    out / name, log=lambda m: print("LOG", m, flush=True),
                    parallel=Parallel.defaults(**{"timeout": 120, **settings}))
    import torch.distributed as dist
    rank = dist.get_rank() if dist.is_initialized() else 0
    keys = ("best_valid_loss", "best_valid_frame_accuracy", "strategy", "mean_t_calc", "mean_t_transmit",
            "mean_t_merge", "mean_t_wait", "mean_bytes_per_step", "steps", "world_size", "device")
    result = {"name": name, "rank": rank, **{k: summary[k] for k in keys}}
    (out / f"{name}.{rank}.result.json").write_text(json.dumps(result))
"""


def torchrun(root: Path, out: Path, runs: dict[str, dict], processes: int) -> list[str]:
    """The torchrun command running SCRIPT with ``processes`` learners."""
    script = out / "learners.py"
    out.mkdir(parents=True, exist_ok=True)
    script.write_text(SCRIPT)
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(processes), "--master-addr",
            "127.0.0.1", "--master-port", str(free_port()), str(script), str(root), str(out), json.dumps(runs)]


ENV = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}  # gloo on CPU, on GPU machines too


def run_learners(root: Path, out: Path, runs: dict[str, dict], processes: int, timeout: int = 600) -> dict[str, dict]:
    """Run SCRIPT under torchrun; learner 0's summary per run (and ``name@rank`` for each learner's)."""
    proc = subprocess.run(torchrun(root, out, runs, processes), capture_output=True, text=True, timeout=timeout,
                          env=ENV)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = [json.loads(path.read_text()) for path in sorted(out.glob("*.result.json"))]
    assert len(results) == processes * len(runs), proc.stdout[-2000:]
    (out / "results.json").write_text(json.dumps(results, indent=1))
    return {r["name"]: r for r in results if r["rank"] == 0} | {
        f'{r["name"]}@{r["rank"]}': r for r in results}


@pytest.fixture(scope="module")
def two_learners(fbank, tmp_path_factory) -> dict[str, dict]:  # noqa: F811
    runs = {"single": {"strategy": "allreduce", "learners": 1}}
    base = {name: {"strategy": name, "learners": 2}
            for name in ("allreduce", "ring", "kavg", "adpsgd", "asgd", "pipeline")}
    base["kavg"]["k"] = 2
    base["kavg_overlap"] = {**base["kavg"], "overlap": True}
    compressed = {f"{name}_1bit": {"strategy": name, "learners": 2, "compression": "1bit"}
                  for name in ("allreduce", "ring", "kavg")}
    single = run_learners(fbank, tmp_path_factory.mktemp("one"), runs, 1)
    return {**single, **run_learners(fbank, tmp_path_factory.mktemp("two"), {**base, **compressed}, 2)}


CHANCE = float(torch.log(torch.tensor(4.0)))


@pytest.mark.parametrize("name", ["allreduce", "ring", "kavg", "kavg_overlap", "adpsgd", "asgd", "pipeline",
                                  "allreduce_1bit", "ring_1bit", "kavg_1bit"])
def test_every_strategy_learns_with_two_learners(two_learners, name) -> None:
    result = two_learners[name]
    assert result["world_size"] == 2 and result["strategy"] == name.split("_")[0]
    assert result["best_valid_loss"] < 0.9 * CHANCE, result
    assert result["mean_t_calc"] > 0 and result["mean_t_merge"] > 0
    assert max(two_learners[f"{name}@{rank}"]["mean_bytes_per_step"] for rank in (0, 1)) > 0


def test_one_bit_compression_cuts_bytes(two_learners) -> None:
    for name in ("allreduce", "ring", "kavg"):
        ratio = two_learners[name]["mean_bytes_per_step"] / two_learners[f"{name}_1bit"]["mean_bytes_per_step"]
        assert ratio >= 20, (name, ratio)


def test_hierarchical_groups_of_two(fbank, tmp_path) -> None:  # noqa: F811
    runs = {"hier": {"strategy": "hierarchical", "learners": 4, "group_size": 2}}
    result = run_learners(fbank, tmp_path, runs, 4)["hier"]
    assert result["best_valid_loss"] < 0.9 * CHANCE, result


@pytest.mark.parametrize("strategy", ["ring", "allreduce"])
def test_a_stuck_learner_fails_the_job_naming_it(fbank, tmp_path, strategy) -> None:  # noqa: F811
    runs = {"stuck": {"strategy": strategy, "learners": 2, "timeout": 4}, "_test": {"stall_rank": 1}}
    proc = subprocess.run(torchrun(fbank, tmp_path, runs, 2), capture_output=True, text=True, timeout=300, env=ENV)
    assert proc.returncode != 0
    message = [line for line in (proc.stdout + proc.stderr).splitlines() if "asrflow.parallel.ParallelError:" in line]
    assert message and "rank 1 is stuck or died" in message[0], (proc.stdout + proc.stderr)[-3000:]


def test_a_killed_learner_fails_cleanly_and_the_restart_resumes(fbank, tmp_path) -> None:  # noqa: F811
    import psutil

    runs = {"ring": {"strategy": "ring", "learners": 2}, "_test": {"epochs": 30}}
    cmd = torchrun(fbank, tmp_path, runs, 2)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=ENV)
    agent = psutil.Process(proc.pid)
    checkpoint = tmp_path / "ring" / "checkpoint.pt"
    deadline = time.monotonic() + 120
    while not checkpoint.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    learners = agent.children(recursive=True)
    assert proc.poll() is None and len(learners) == 2, "training ended before a learner could be killed"
    victim = next(p for p in learners if "learners.py" in " ".join(p.cmdline()))
    victim.kill()
    output = proc.communicate(timeout=120)[0]
    assert proc.returncode != 0, output[-2000:]
    gone, alive = psutil.wait_procs(learners, timeout=30)
    assert not alive, f"orphan learners: {alive}"
    resumed = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=ENV)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert "resumed from" in resumed.stdout


def test_a_pipeline_resumed_from_its_checkpoint_trains_the_same_model(fbank, tmp_path) -> None:  # noqa: F811
    """The pipeline drains before every checkpoint (every 4 steps here) and at epoch ends: stopping after
    two epochs and training on to three gives the weights of three epochs in one go (the first stage's last
    update, which weight prediction extrapolates, saved with it)."""
    runs = {"pipe": {"strategy": "pipeline", "learners": 2, "predict_weights": True}}
    for out, epochs in (("whole", 3), ("parts", 2), ("parts", 3)):
        proc = subprocess.run(torchrun(fbank, tmp_path / out, {**runs, "_test": {"epochs": epochs}}, 2),
                              capture_output=True, text=True, timeout=600, env=ENV)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "resumed from" in proc.stdout
    whole = torch.load(tmp_path / "whole" / "pipe" / "final.pt", weights_only=True)["model"]
    parts = torch.load(tmp_path / "parts" / "pipe" / "final.pt", weights_only=True)["model"]
    assert all(torch.equal(whole[k], parts[k]) for k in whole)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")
def test_every_strategy_runs_two_learners_on_one_gpu_over_gloo(fbank, tmp_path) -> None:  # noqa: F811
    """The strategies' GPU code with two learners on one GPU: gloo carries CUDA tensors (NCCL cannot put two
    ranks on one GPU), point-to-point messages through the CPU."""
    runs = {name: {"strategy": name, "learners": 2, "backend": "gloo"}
            for name in ("allreduce", "ring", "kavg", "adpsgd", "asgd", "pipeline")}
    runs["ring_1bit"] = {**runs["ring"], "compression": "1bit"}
    runs["hierarchical"] = {"strategy": "hierarchical", "learners": 2, "group_size": 2, "backend": "gloo"}
    proc = subprocess.run(torchrun(fbank, tmp_path, {**runs, "_test": {"epochs": 3}}, 2), capture_output=True,
                          text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for name in runs:
        result = json.loads((tmp_path / f"{name}.0.result.json").read_text())
        assert result["world_size"] == 2 and result["device"] == "cuda:0", name
        assert result["best_valid_loss"] < 0.9 * CHANCE, name
