"""The trainer: learns, checkpoints, and resumes after SIGKILL to exactly the same model."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from .helpers import free_port, kill_at_first_checkpoint
from .test_data import fbank  # noqa: F401  (module fixture: yesno fbank features)

SCRIPT = """
import sys
from pathlib import Path
from asrflow.nnet.data import FeatureDataset
from asrflow.config.settings import Training
from asrflow.nnet.train import train
from asrflow.features import read_scp
from asrflow.data.datadir import read_table

root, out = Path(sys.argv[1]), Path(sys.argv[2])
frames = {u: int(n) for u, n in read_table(root / "fbank" / "train" / "utt2num_frames").items()}
# Learnable toy targets: 4 classes by position in the utterance.
targets = {u: (__import__("numpy").arange(n) * 4 // n) for u, n in frames.items()}
data = FeatureDataset(root / "data", root / "fbank", "train", targets)
epochs = int(sys.argv[3]) if len(sys.argv) > 3 else 3
opts = Training.defaults(epochs=epochs, max_frames=2000, lr=3e-3, warmup_steps=5, checkpoint_every=5,
                         checkpoint_minutes=0, patience=5, seed=3,
                         specaugment={"freq_masks": 1, "freq_width": 4, "time_masks": 1, "time_width": 10})
summary = train({"type": "dnn", "hidden": 64, "layers": 2, "context": 2, "dropout": 0.1}, opts, data, data, 4, out,
                log=lambda line: print(line) if line.startswith(("resumed", "ignoring")) else None)
print("run", summary["seconds"], summary["frames_per_second"])
print("best", summary["best_valid_loss"])
"""


def _run(root: Path, out: Path, epochs: int = 3) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", SCRIPT, str(root), str(out), str(epochs)], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def _figures(output: str) -> tuple[float, float]:
    """The training seconds and frames/s a run's summary reports."""
    seconds, fps = output.split("run ")[-1].split()[:2]
    return float(seconds), float(fps)


def _final(root: Path, out: Path, epochs: int) -> tuple[dict, str]:
    """Train (or resume) to ``epochs`` in ``out``: its final.pt and the run's output."""
    proc = _run(root, out, epochs)
    output = proc.communicate(timeout=300)[0]
    assert proc.returncode == 0, output
    return torch.load(out / "final.pt", weights_only=True), output


def test_sigkill_and_resume_gives_the_same_model(fbank, tmp_path: Path) -> None:  # noqa: F811
    reference, output = _final(fbank, tmp_path / "straight", 3)
    best = float(output.split("best")[-1])
    assert best < 0.9 * torch.log(torch.tensor(4.0)).item()  # learnt something beyond chance (ln 4)

    ckpt = kill_at_first_checkpoint(_run(fbank, tmp_path / "killed"), tmp_path / "killed" / "checkpoint.pt")
    state = torch.load(ckpt, weights_only=True)["state"]
    assert state["epoch"] == 0 and state["batch"] > 0  # killed mid-epoch
    final, _ = _final(fbank, tmp_path / "killed", 3)
    assert final["model"].keys() == reference["model"].keys()
    for key, value in reference["model"].items():
        assert torch.equal(value, final["model"][key]), key
    assert final["config"]["type"] == "dnn" and final["num_classes"] == 4
    assert not list((tmp_path / "killed").glob("*.tmp"))


def test_a_run_resumes_across_a_change_of_epochs(fbank, tmp_path: Path) -> None:  # noqa: F811
    """epochs only says when to stop: 1 epoch, then the same run raised to 2, is the run of 2 straight;
    lowered back to 1 it stops at once with the best model of its first 2 epochs."""
    straight, _ = _final(fbank, tmp_path / "straight", 2)
    _final(fbank, tmp_path / "raised", 1)
    raised, output = _final(fbank, tmp_path / "raised", 2)
    assert "resumed from" in output and "epoch 1, batch 0" in output, output
    assert torch.load(tmp_path / "raised" / "checkpoint.pt", weights_only=True)["state"]["epoch"] == 2
    for key, value in straight["model"].items():
        assert torch.equal(value, raised["model"][key]), key
    fps = _figures(output)[1]
    saved = torch.load(tmp_path / "raised" / "checkpoint.pt", weights_only=True)["seconds"]
    lowered, output = _final(fbank, tmp_path / "raised", 1)
    assert "resumed from" in output and "epoch 2, batch 0" in output, output
    # no step in this run, yet its summary is the whole run's: time and throughput carried by the checkpoint
    assert fps > 0 and saved > 0 and _figures(output)[0] >= saved and _figures(output)[1] == pytest.approx(fps)
    for key, value in straight["model"].items():
        assert torch.equal(value, lowered["model"][key]), key


def test_two_learners_under_torchrun(fbank, tmp_path: Path) -> None:  # noqa: F811
    """DDP with gloo on loopback: both ranks step in lock-step and rank 0 writes the model."""
    script = tmp_path / "train_toy.py"
    script.write_text(SCRIPT)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
           "--master-port", str(free_port()), str(script), str(fbank), str(tmp_path / "ddp")]
    # gloo on the CPU, also on a machine with fewer GPUs than learners (NCCL would need one GPU each)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    final = torch.load(tmp_path / "ddp" / "final.pt", weights_only=True)
    assert final["num_classes"] == 4
    assert proc.stdout.count("best") == 2  # both ranks finished


def test_schedules_warm_up_then_decay_or_newbob() -> None:
    from asrflow.config.settings import Training
    from asrflow.nnet.train import Schedule, newbob_update

    inv = Schedule("warmup_invsqrt", 10)
    assert inv(0) == 0.1 and inv(9) == 1.0 and abs(inv(39) - 0.5) < 1e-12
    bob = Schedule("newbob", 10)
    opts = Training.defaults(newbob_threshold=0.01, newbob_factor=0.5)
    assert bob(100) == 1.0
    assert not newbob_update(bob, float("inf"), 2.0, opts)  # first epoch: nothing to compare
    assert not newbob_update(bob, 2.0, 1.5, opts) and bob.scale == 1.0  # 25 % better: keep the rate
    assert newbob_update(bob, 1.5, 1.499, opts) and bob(100) == 0.5  # plateau: halve
    assert newbob_update(bob, 1.499, 1.6, opts) and bob.scale == 0.25  # worse: halve again
    assert not newbob_update(inv, 2.0, 2.0, opts)  # only newbob reacts


def test_the_exponential_schedule_falls_to_its_final_factor_over_the_run() -> None:
    from asrflow.nnet.train import Schedule, run_steps

    exp = Schedule("exponential", 10, total=100.0, final=0.1)
    assert exp(0) == 0.1 * 0.1 ** 0.0  # warm-up first
    assert abs(exp(9) - 0.1 ** 0.09) < 1e-12 and abs(exp(49) - 0.1 ** 0.49) < 1e-12
    assert abs(exp(99) - 0.1 ** 0.99) < 1e-12 and exp(150) == 0.1  # past the planned end: the final rate
    learner = Schedule("exponential", 10, ticks=0.5, total=100.0, final=0.1)  # two learners, max_frames each
    assert learner(20) == exp(40)
    with pytest.raises(ValueError, match="needs the run's length"):
        Schedule("exponential", 10)
    with pytest.raises(ValueError, match="known: warmup_invsqrt, newbob, exponential"):
        Schedule("cosine", 10)
    # 3 epochs of 40 batches: one learner; 2 learners of max_frames each reading half; 2 sharing max_frames
    assert run_steps(3, 40, 1, 2000, 2000) == 120 == run_steps(3, 20, 2, 2000, 2000) == run_steps(3, 40, 2, 1000, 2000)


def test_an_exponential_run_ends_at_its_final_rate_and_resumes_only_with_its_epochs(tmp_path: Path) -> None:
    from asrflow.config.settings import Training
    from asrflow.nnet.data import FeatureDataset
    from asrflow.nnet.train import _resume_identity, train

    from .helpers import synthetic_split

    labels = synthetic_split(tmp_path, utterances=12)
    data = FeatureDataset(tmp_path / "data", tmp_path / "feats", "train", labels)
    config = {"type": "dnn", "hidden": 16, "layers": 1, "context": 1, "dropout": 0.0}
    opts = Training.defaults(epochs=3, max_frames=300, lr=1e-2, warmup_steps=2, patience=3, seed=1, log_every=1,
                             schedule="exponential", final_lr_factor=0.05, keep="last")
    rates: list[float] = []
    summary = train(config, opts, data, data, 4, tmp_path / "run", log=lambda line: None,
                    log_metrics=lambda step, metrics: rates.append(metrics["lr"]) if "lr" in metrics else None)
    after_warm_up = rates[2:]
    assert summary["steps"] > 6 and after_warm_up == sorted(after_warm_up, reverse=True)
    assert abs(rates[-1] - 0.05 * 1e-2) < 1e-9  # every planned step taken: the final rate exactly
    invsqrt = opts.replace(schedule="warmup_invsqrt")
    assert _resume_identity(config, invsqrt) == _resume_identity(config, invsqrt.replace(epochs=9))
    assert _resume_identity(config, opts) != _resume_identity(config, opts.replace(epochs=9))


def test_the_schedule_follows_the_data_whoever_reads_it() -> None:
    """Ticks per max_frames of data: P learners sharing max_frames tick once per step each, as one
    learner would; learners reading max_frames each are P steps ahead; the ASGD server applies P shares."""
    from asrflow.config.settings import Parallel
    from asrflow.nnet.train import Schedule

    one = Schedule("warmup_invsqrt", 10)
    for strategy in ("allreduce", "ring", "kavg", "adpsgd", "hierarchical", "asgd"):
        shared, own = Parallel.defaults(strategy=strategy), Parallel.defaults(strategy=strategy, batch="learner")
        assert shared.schedule_ticks(2) == 1.0 and own.schedule_ticks(2) == 0.5 and shared.schedule_ticks(1) == 1.0
    assert Parallel.defaults(strategy="asgd").schedule_ticks(4, server=True) == 4.0
    assert Parallel.defaults(strategy="asgd", batch="learner").schedule_ticks(4, server=True) == 1.0
    server, learner = Schedule("warmup_invsqrt", 10, ticks=4.0), Schedule("warmup_invsqrt", 10, ticks=0.5)
    for step in (0, 5, 9, 40):
        assert server(4 * step + 3) == one(step + 0.75) and learner(step) == one(2 * step)


def test_each_learner_takes_its_own_gpu_or_fails_saying_why() -> None:
    from asrflow.nnet import NnetError
    from asrflow.nnet.train import learner_device

    assert learner_device(0, 0) == torch.device("cpu") == learner_device(3, 0)  # no GPU: every learner on the CPU
    assert learner_device(1, 2) == torch.device("cuda", 1)
    with pytest.raises(NnetError, match="learner 1 of this node has no GPU: the node has 1 GPU"):
        learner_device(1, 1)
    # with the gloo backend learners share the GPUs in turn
    assert learner_device(1, 1, share=True) == torch.device("cuda", 0) == learner_device(2, 2, share=True)
    assert learner_device(1, 0, share=True) == torch.device("cpu")


def test_checkpoints_between_epoch_ends_wait_for_the_clock(fbank, tmp_path: Path,  # noqa: F811
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """checkpoint_minutes: looking every step, a checkpoint is written mid-epoch only once that much wall clock
    has passed since the last (0: at every look); every epoch end writes one."""
    import numpy as np

    import asrflow.nnet.train as trainer
    from asrflow.config.settings import Training
    from asrflow.data.datadir import read_table
    from asrflow.nnet.data import FeatureDataset

    frames = {u: int(n) for u, n in read_table(fbank / "fbank" / "train" / "utt2num_frames").items()}
    data = FeatureDataset(fbank / "data", fbank / "fbank", "train",
                          {u: np.arange(n) * 4 // n for u, n in frames.items()})
    positions: list[tuple[int, int]] = []
    write = trainer.atomic_save

    def recording(obj: dict, path: Path) -> None:
        if "state" in obj:
            positions.append((obj["state"]["epoch"], obj["state"]["batch"]))
        write(obj, path)

    monkeypatch.setattr(trainer, "atomic_save", recording)
    for minutes in (1e6, 0):
        positions.clear()
        opts = Training.defaults(epochs=2, max_frames=2000, warmup_steps=1, checkpoint_every=1,
                                 checkpoint_minutes=minutes, patience=5)
        trainer.train({"type": "dnn", "hidden": 16, "layers": 1, "context": 1, "dropout": 0.0}, opts, data, data,
                      4, tmp_path / f"m{minutes}", log=lambda *_: None)
        mid_epoch = [p for p in positions if p[1] > 0]
        assert [p for p in positions if p[1] == 0] == [(1, 0), (2, 0)]  # the two epoch ends
        assert (not mid_epoch) if minutes else len(mid_epoch) > 2


def test_loader_workers_and_metric_intervals_change_no_result(fbank, tmp_path: Path) -> None:  # noqa: F811
    """Batches made by DataLoader worker processes train the same model as the background thread; metrics
    come every log_every steps and at each epoch end, as means over the steps since the last."""
    import numpy as np

    from asrflow.config.settings import Training
    from asrflow.data.datadir import read_table
    from asrflow.nnet.data import FeatureDataset
    from asrflow.nnet.train import train

    frames = {u: int(n) for u, n in read_table(fbank / "fbank" / "train" / "utt2num_frames").items()}
    targets = {u: np.arange(n) * 4 // n for u, n in frames.items()}
    data = FeatureDataset(fbank / "data", fbank / "fbank", "train", targets)
    model = {"type": "dnn", "hidden": 32, "layers": 1, "context": 1, "dropout": 0.1}
    finals, logs, epoch_losses = [], [], []
    for workers, every in ((0, 50), (2, 3)):
        logged: list[tuple[int, dict]] = []
        opts = Training.defaults(epochs=2, max_frames=2000, lr=3e-3, warmup_steps=2, seed=1, loader_workers=workers,
                                 log_every=every,
                                 specaugment={"freq_masks": 1, "freq_width": 4, "time_masks": 1, "time_width": 10})
        summary = train(model, opts, data, data, 4, tmp_path / f"w{workers}", log=lambda *_: None,
                        log_metrics=lambda step, m, into=logged: into.append((step, m)))
        finals.append(torch.load(tmp_path / f"w{workers}" / "final.pt", weights_only=True)["model"])
        logs.append([(step, m) for step, m in logged if "loss" in m])
        epoch_losses.append([m["epoch_train_loss"] for _, m in logged if "epoch_train_loss" in m])
    for key, value in finals[0].items():
        assert torch.equal(value, finals[1][key]), key
    per_epoch = summary["steps"] // 2
    assert [step for step, _ in logs[0]] == [per_epoch, 2 * per_epoch]  # only the epoch ends
    expected = sorted({*range(3, 2 * per_epoch + 1, 3), per_epoch, 2 * per_epoch})
    assert [step for step, _ in logs[1]] == expected
    for _, metrics in logs[1]:
        assert 0 < metrics["loss"] < 10 and 0 <= metrics["frame_accuracy"] <= 1 and metrics["frames_per_second"] > 0
        assert 0 <= metrics["data_wait_fraction"] <= 1
    # each epoch's training loss is the mean over all its steps, however often the metrics came
    assert len(epoch_losses[0]) == 2
    np.testing.assert_allclose(epoch_losses[0], [m["loss"] for _, m in logs[0]], rtol=1e-9)
    np.testing.assert_allclose(epoch_losses[1], epoch_losses[0], rtol=1e-6)
    assert epoch_losses[0][1] < epoch_losses[0][0]


def test_checkpoints_are_written_from_a_snapshot_in_the_background(tmp_path: Path) -> None:
    """What training changes after asking for a checkpoint is not in it; a failed write is raised on wait()."""
    from asrflow.nnet.train import CheckpointWriter

    weights = torch.zeros(3)
    writer = CheckpointWriter()
    writer.write({"model": {"w": weights}, "state": {"step": 1}}, tmp_path / "checkpoint.pt")
    weights += 1  # the training step after it
    writer.wait()
    saved = torch.load(tmp_path / "checkpoint.pt", weights_only=True)
    assert torch.equal(saved["model"]["w"], torch.zeros(3)) and saved["state"] == {"step": 1}
    writer.write({"w": weights}, tmp_path / "missing" / "checkpoint.pt")
    with pytest.raises(RuntimeError, match="does not exist"):
        writer.wait()
    writer.wait()  # the error is raised once


def test_examples_train_on_frames_whose_label_needs_their_context(tmp_path: Path) -> None:
    """Each frame's label is the class two frames ahead: a DNN with 3 frames of context learns it from
    8-frame examples (the labelled frames at an example's edge see their utterance's real neighbours), in as
    many steps per epoch as the shuffled examples fill batches."""
    import numpy as np

    from asrflow.config.settings import Training
    from asrflow.nnet.data import ExampleDataset, FeatureDataset
    from asrflow.nnet.train import train

    from .helpers import synthetic_split

    labels = synthetic_split(tmp_path, utterances=48)
    targets = {u: np.concatenate([c[2:], np.repeat(c[-1:], 2)]) for u, c in labels.items()}
    data = FeatureDataset(tmp_path / "data", tmp_path / "feats", "train", targets)
    opts = Training.defaults(epochs=4, max_frames=700, lr=3e-3, warmup_steps=5, example_frames=8, patience=4)
    summary = train({"type": "dnn", "hidden": 64, "layers": 2, "context": 3, "dropout": 0.0}, opts, data, data, 4,
                    tmp_path / "out", log=lambda *_: None)
    assert summary["best_valid_frame_accuracy"] > 0.95
    examples = ExampleDataset(data, 8, 3)
    per_batch = 700 // max(examples.lengths)
    assert summary["steps"] == 4 * -(-len(examples) // per_batch)
    from asrflow.nnet import NnetError

    with pytest.raises(NnetError, match="bounded window"):
        train({"type": "lstm", "hidden": 8, "layers": 1}, opts, data, data, 4, tmp_path / "lstm", log=lambda *_: None)


def test_config_allows_examples_for_feed_forward_hybrids_only() -> None:
    from asrflow.config import ConfigError, resolve_config

    def config(model: dict) -> dict:
        return resolve_config({"experiment": "x", "corpus": {"name": "yesno"}, "evaluation": {"systems": ["net"]},
                               "nnet": {"models": {"net": model}}})

    config({"type": "dnn", "train": {"example_frames": 8}})
    config({"type": "cnn", "train": {"example_frames": 8}})
    for model in ({"type": "lstm"}, {"type": "cnn", "objective": "ctc", "units": "phone"}):
        with pytest.raises(ConfigError, match="feed-forward hybrid"):
            config({**model, "train": {"example_frames": 8}})
    with pytest.raises(ConfigError, match="chunk_frames and mmi"):
        config({"type": "dnn", "train": {"example_frames": 8, "mmi": {"weight": 1.0}}})


def test_the_trainers_adamw_is_fused_and_steps_as_the_reference_loop() -> None:
    """The fused AdamW on CPU updates the weights as PyTorch's per-tensor AdamW does, step for step."""
    from asrflow.nnet.models import build_model
    from asrflow.nnet.train import adamw

    torch.manual_seed(0)
    config = {"type": "dnn", "hidden": 16, "layers": 2, "context": 1, "dropout": 0.0}
    fused_model, plain_model = (build_model(config, input_dim=5, output_dim=3) for _ in range(2))
    plain_model.load_state_dict(fused_model.state_dict())
    start = [p.detach().clone() for p in fused_model.parameters()]
    fused = adamw(fused_model.parameters(), torch.device("cpu"), lr=1e-2, weight_decay=0.1)
    plain = torch.optim.AdamW(plain_model.parameters(), lr=1e-2, weight_decay=0.1, foreach=False)
    assert fused.defaults["fused"] and not plain.defaults["fused"]
    x, lengths, y = torch.randn(2, 7, 5), torch.tensor([7, 4]), torch.randint(0, 3, (2, 7))
    for _ in range(5):
        for model, optimiser in ((fused_model, fused), (plain_model, plain)):
            optimiser.zero_grad()
            logits, _ = model(x, lengths)
            torch.nn.functional.cross_entropy(logits.reshape(-1, 3), y.reshape(-1)).backward()
            optimiser.step()
    for a, b, before in zip(fused_model.parameters(), plain_model.parameters(), start, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        assert not torch.equal(a, before)  # five steps moved every weight
