"""The trainer on a GPU: every model under bfloat16 autocast, and SIGKILL + resume bit-identical there.

Skipped without CUDA (CI has none); run on a GPU machine with ``pytest tests/nnet/test_gpu.py``.
The data is generated (:mod:`tests.nnet.helpers`).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from asrflow.config.settings import Training
from asrflow.nnet.data import FeatureDataset
from asrflow.nnet.train import train

from .helpers import collapse, free_port, kill_at_first_checkpoint, synthetic_split

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")

MODELS = {
    "dnn": ({"type": "dnn", "hidden": 64, "layers": 2, "context": 2}, "hybrid"),
    "lstm": ({"type": "lstm", "hidden": 32, "layers": 1, "bidirectional": True}, "hybrid"),
    "cnn": ({"type": "cnn", "channels": [8], "tdnn_dim": 32, "tdnn_dilations": [1, 2]}, "hybrid"),
    "ctc": ({"type": "cnn", "channels": [8], "tdnn_dim": 32, "tdnn_dilations": [1, 2], "subsampling": 2}, "ctc"),
    "conformer": ({"type": "conformer", "dim": 32, "layers": 2, "heads": 4, "ffn_dim": 64, "kernel": 5,
                   "channels": [8]}, "hybrid"),
    "conformer_ctc": ({"type": "conformer", "dim": 32, "layers": 2, "heads": 4, "ffn_dim": 64, "kernel": 5,
                       "channels": [8, 8], "subsampling": 4}, "ctc"),
}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_every_model_learns_under_bf16_autocast(name: str, tmp_path: Path) -> None:
    labels = synthetic_split(tmp_path)
    config, objective = MODELS[name]
    if objective == "ctc":  # the class sequence without repeats, as units 1..4
        labels = {u: np.asarray([c + 1 for c in collapse(seq)]) for u, seq in labels.items()}
    data = FeatureDataset(tmp_path / "data", tmp_path / "feats", "train", labels, objective == "hybrid",
                          subsampling=config.get("subsampling", 1))
    opts = Training.defaults(epochs=8, max_frames=2000, lr=5e-3, warmup_steps=5, patience=8, amp=True)
    summary = train(config, opts, data, data, 5 if objective == "ctc" else 4, tmp_path / "out", log=lambda *_: None,
                    objective=objective)
    assert summary["device"].startswith("cuda")
    chance = np.log(4.0) if objective == "hybrid" else None
    if chance is not None:
        assert summary["best_valid_loss"] < 0.5 * chance and summary["best_valid_frame_accuracy"] > 0.8
    else:
        assert summary["best_valid_loss"] < 10.0  # CTC loss per utterance, about 90 at the start
    final = torch.load(tmp_path / "out" / "final.pt", weights_only=True, map_location="cpu")
    assert all(v.device.type == "cpu" for v in final["model"].values())


SCRIPT = """
import sys
from pathlib import Path
import numpy as np
from asrflow.nnet.data import FeatureDataset
from asrflow.config.settings import Training
from asrflow.nnet.train import train
sys.path.insert(0, sys.argv[3])
from tests.nnet.helpers import synthetic_split

root, out = Path(sys.argv[1]), Path(sys.argv[2])
labels = synthetic_split(root) if not (root / "feats").exists() else None
if labels is None:
    from tests.nnet.helpers import read_int_archive
    labels = read_int_archive(root / "labels.txt")
else:
    (root / "labels.txt").write_text("".join(f"{u} {' '.join(map(str, l))}\\n" for u, l in labels.items()))
data = FeatureDataset(root / "data", root / "feats", "train", labels)
opts = Training.defaults(epochs=3, max_frames=600, lr=3e-3, warmup_steps=5, checkpoint_every=5, checkpoint_minutes=0,
                    patience=5, seed=3, deterministic=True)
summary = train({"type": "dnn", "hidden": 64, "layers": 2, "context": 2, "dropout": 0.2}, opts, data, data, 4, out,
                log=lambda *_: None)
print("device", summary["device"], "best", summary["best_valid_loss"])
"""


def _run(root: Path, out: Path) -> subprocess.Popen:
    repo = str(Path(__file__).resolve().parents[2])
    return subprocess.Popen([sys.executable, "-c", SCRIPT, str(root), str(out), repo], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def test_sigkill_and_resume_on_the_gpu_gives_the_same_model(tmp_path: Path) -> None:
    root = tmp_path / "corpus"
    root.mkdir()
    straight = _run(root, tmp_path / "straight")
    output = straight.communicate(timeout=300)[0]
    assert straight.returncode == 0, output
    assert "device cuda" in output
    reference = torch.load(tmp_path / "straight" / "final.pt", weights_only=True, map_location="cpu")

    ckpt = kill_at_first_checkpoint(_run(root, tmp_path / "killed"), tmp_path / "killed" / "checkpoint.pt")
    state = torch.load(ckpt, weights_only=True, map_location="cpu")
    assert state["state"]["epoch"] == 0 and state["state"]["batch"] > 0  # killed mid-epoch
    assert "cuda_rng" in state["learners"][0]  # dropout masks come from the GPU's generator
    resumed = _run(root, tmp_path / "killed")
    output = resumed.communicate(timeout=300)[0]
    assert resumed.returncode == 0, output
    final = torch.load(tmp_path / "killed" / "final.pt", weights_only=True, map_location="cpu")
    for key, value in reference["model"].items():
        assert torch.equal(value, final["model"][key]), key


@pytest.mark.skipif(torch.cuda.device_count() != 1, reason="needs a machine with exactly one GPU")
def test_two_learners_on_one_gpu_are_refused_with_a_clear_message(tmp_path: Path) -> None:
    """NCCL needs one GPU per learner: the second learner says so, naming the setting to change."""
    script = tmp_path / "learner.py"
    script.write_text("from asrflow.nnet.train import _distributed\n_distributed(timeout=60)\n")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(free_port()), str(script)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert "learner 1 of this node has no GPU: the node has 1 GPU(s)" in proc.stdout + proc.stderr


def test_loader_workers_and_compile_train_the_same_network_on_the_gpu(tmp_path: Path) -> None:
    """DataLoader workers (pinned batches) and torch.compile on CUDA: the network learns as without them."""
    labels = synthetic_split(tmp_path)
    data = FeatureDataset(tmp_path / "data", tmp_path / "feats", "train", labels)
    config = {"type": "dnn", "hidden": 64, "layers": 2, "context": 2}
    opts = Training.defaults(epochs=6, max_frames=2000, lr=5e-3, warmup_steps=5, patience=6, amp=True,
                             loader_workers=2, compile=True, log_every=2)
    logged: list[dict] = []
    summary = train(config, opts, data, data, 4, tmp_path / "out", log=lambda *_: None,
                    log_metrics=lambda step, m: logged.append(m))
    assert summary["device"].startswith("cuda")
    assert summary["best_valid_loss"] < 0.5 * np.log(4.0) and summary["best_valid_frame_accuracy"] > 0.8
    assert any("frame_accuracy" in m for m in logged)


@pytest.mark.parametrize("name", ["dnn", "lstm", "cnn"])
def test_decoding_on_the_gpu_scores_as_on_the_cpu(name: str, tmp_path: Path) -> None:
    """``nnet.decode.device: cuda``: each padded batch runs on the GPU and the log posteriors come back to the CPU
    equal to the CPU's, whatever the batch size (to the rounding of cuDNN's TF32 convolutions)."""
    from asrflow.nnet.inference import Scoring
    from asrflow.nnet.models import build_model

    config = MODELS[name][0]
    torch.manual_seed(0)
    torch.save({"model": build_model(config, 10, 7).state_dict(), "config": config, "input_dim": 10,
                "num_classes": 7}, tmp_path / "final.pt")
    feats = [torch.randn(n, 10).numpy() for n in (50, 23, 81, 7)]
    cpu = Scoring(str(tmp_path / "final.pt"), batch_frames=100).log_posteriors(feats)
    for batch in (1, 100, 10000):
        gpu = Scoring(str(tmp_path / "final.pt"), batch_frames=batch, device="cuda").log_posteriors(feats)
        for want, got in zip(cpu, gpu):
            assert isinstance(got, np.ndarray) and got.shape == want.shape
            np.testing.assert_allclose(got, want, rtol=5e-3, atol=5e-3)
