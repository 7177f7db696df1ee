"""Pipelined back-propagation: stages balanced by multiply-adds, and two learner processes (gloo on loopback)
against the same schedule played out in one process."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from asrflow.config.settings import Parallel, Training
from asrflow.nnet.models import build_model
from asrflow.nnet.objectives import frame_cross_entropy
from asrflow.nnet.train import Schedule
from asrflow.parallel import ParallelError
from asrflow.parallel.emulate import _Pipeline
from asrflow.parallel.pipeline import _Stage, balance, layer_units, unit_costs
from tests.nnet.helpers import free_port

DNN = {"type": "dnn", "hidden": 24, "layers": 3, "context": 1, "dropout": 0.0}
TDNN = {"type": "cnn", "channels": [4], "tdnn_dim": 16, "tdnn_dilations": [1, 2], "norm": "layer", "dropout": 0.0}
LR, BATCHES, CLASSES = 0.01, 7, 5


def test_balance_minimises_the_heaviest_stage() -> None:
    assert balance([1, 1, 1, 1], 2) == [0, 2, 4]
    assert balance([1, 1, 1, 6], 2) == [0, 3, 4]  # the heavy output layer alone
    assert balance([5, 1, 1, 1, 5], 3) == [0, 1, 4, 5]
    assert balance([3], 1) == [0, 1]
    assert balance([0, 2, 2, 2, 2], 4) == [0, 2, 3, 4, 5]  # a unit without weights is never a stage of its own
    assert balance([0, 1, 0, 5], 2) == [0, 3, 4]
    with pytest.raises(ParallelError, match="3 stages for a network of 2 layers with weights"):
        balance([1, 1], 3)
    with pytest.raises(ParallelError, match="3 stages for a network of 2 layers with weights"):
        balance([0, 1, 1], 3)


@pytest.mark.parametrize("config", [DNN, TDNN])
def test_the_units_in_order_compute_the_network(config: dict) -> None:
    torch.manual_seed(0)
    model = build_model(config, 6, CLASSES).eval()
    units = layer_units(model)
    x, lengths = torch.randn(2, 15, 6), torch.tensor([15, 9])
    with torch.no_grad():
        torch.testing.assert_close(_Stage(units)(x, lengths), model(x, lengths)[0])
    assert sum(unit_costs(units)) == sum(p.numel() for p in model.parameters() if p.dim() > 1)
    with pytest.raises(ParallelError, match="LSTM"):
        layer_units(build_model({"type": "lstm", "hidden": 4, "layers": 1}, 6, CLASSES))


def _batches() -> list[dict]:
    generator = torch.Generator().manual_seed(7)
    out = []
    for _ in range(BATCHES):
        lengths = torch.tensor([12, 9])
        targets = torch.randint(CLASSES, (2, 12), generator=generator)
        targets[1, 9:] = -100
        out.append({"feats": torch.randn(2, 12, 6, generator=generator), "lengths": lengths, "targets": targets,
                    "target_lengths": lengths.clone()})
    return out


def _model() -> torch.nn.Module:
    torch.manual_seed(1)
    return build_model(DNN, 6, CLASSES)


def _learner(rank: int, port: int, out: str, predict: bool) -> None:
    import torch.distributed as dist

    from asrflow.config.settings import Parallel
    from asrflow.parallel.pipeline import Pipeline

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    model = _model()
    optimiser = torch.optim.AdamW(model.parameters(), lr=LR)
    rule = Parallel.defaults(strategy="pipeline", learners=2, timeout=60, predict_weights=predict)
    pipeline = Pipeline(model, optimiser, None, rule, rank, 2, torch.device("cpu"), clip=1e9)
    losses = []
    for batch in _batches():
        losses.append(pipeline.train_step(batch, frame_cross_entropy).count)
    pipeline.synchronise()
    if rank == 0:
        torch.save({"model": model.state_dict(), "bounds": pipeline.bounds, "counts": losses}, Path(out))
    dist.destroy_process_group()


def _reference(bounds: list[int]) -> dict[str, torch.Tensor]:
    """The two-stage schedule in one process: at tick t, stage 1 runs batch t - 1 forward and back and updates;
    stage 0 runs batch t forward, then batch t - 2 back through the weights of its forward pass, and updates."""
    model = _model()
    units = layer_units(model)
    stages = [_Stage(units[bounds[0]:bounds[1]]), _Stage(units[bounds[1]:bounds[2]])]
    optimisers = [torch.optim.AdamW(stage.parameters(), lr=LR) for stage in stages]
    batches = _batches()
    sent: dict[int, torch.Tensor] = {}  # stage 0's output, by batch
    flight: dict[int, tuple[torch.Tensor, dict]] = {}
    grads: dict[int, torch.Tensor] = {}  # the gradient of stage 0's output, by batch
    for tick in range(BATCHES + 2):
        new_grads = {}
        if 0 <= tick - 1 < BATCHES:
            b = tick - 1
            x = sent[b].detach().requires_grad_()
            loss, _ = frame_cross_entropy(stages[1](x, batches[b]["lengths"]), batches[b]["lengths"], batches[b])
            optimisers[1].zero_grad()
            loss.backward()
            optimisers[1].step()
            new_grads[b] = x.grad
        if tick < BATCHES:
            stash = {n: p.detach().clone().requires_grad_() for n, p in stages[0].named_parameters()}
            y = torch.func.functional_call(stages[0], stash, (batches[tick]["feats"], batches[tick]["lengths"]))
            sent[tick], flight[tick] = y.detach(), (y, stash)
        if 0 <= tick - 2 < BATCHES:
            y, stash = flight.pop(tick - 2)
            y.backward(grads[tick - 2])
            optimisers[0].zero_grad()
            for name, p in stages[0].named_parameters():
                p.grad = stash[name].grad
            optimisers[0].step()
        grads.update(new_grads)
    return model.state_dict()


def _emulated(stages: int, predict: bool = False) -> dict[str, torch.Tensor]:
    """The final weights of the convergence emulation's pipeline on the same batches."""
    opts = Training.defaults(lr=LR, weight_decay=0.01, schedule="newbob", warmup_steps=1, clip=1e9)
    rule = Parallel.defaults(strategy="pipeline", stale_lr="none", predict_weights=predict)
    emulator = _Pipeline(_model(), stages, opts, rule, Schedule(opts.schedule, opts.warmup_steps))
    losses = [emulator.round([batch]) for batch in _batches()]
    emulator.end_epoch()
    assert sum(value != value for value in losses) == stages - 1 and not emulator.flight and not emulator.fed
    return emulator.model().state_dict()


@pytest.mark.parametrize("predict", [False, True])
def test_two_stage_pipeline_matches_its_schedule_in_one_process(tmp_path: Path, predict: bool) -> None:
    """Each stage updates as its gradients arrive, stage 0 two batches late, through the weights that ran its
    forward pass: the learners' final weights are the one-process schedule's (written out by hand; with weight
    prediction the emulation's, which matches the hand-written schedule without)."""
    import torch.multiprocessing as mp

    out = tmp_path / "pipeline.pt"
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.start_processes(_learner, args=(free_port(), str(out), predict), nprocs=2, start_method="spawn", join=True)
    saved = torch.load(out, weights_only=True)
    assert saved["bounds"][0] == 0 and saved["bounds"][-1] == len(layer_units(_model()))
    assert saved["counts"][:2] == [0, 0] and all(c > 0 for c in saved["counts"][2:])  # stage 0 hears losses late
    reference = _emulated(2, predict=True) if predict else _reference(saved["bounds"])
    for name, value in reference.items():
        torch.testing.assert_close(saved["model"][name], value, rtol=1e-5, atol=1e-6, msg=name)
    assert not torch.equal(saved["model"]["output.weight"], _model().state_dict()["output.weight"])


@pytest.mark.parametrize("stages", [2, 3])
def test_the_emulated_pipeline_plays_the_same_schedule(stages: int) -> None:
    """The convergence emulation's pipeline (one process, any stage count) against the two-stage schedule written
    out by hand; three stages drain every batch and change every stage; weight prediction changes the path."""
    final = _emulated(stages)
    if stages == 2:
        reference = _reference(balance(unit_costs(layer_units(_model())), 2))
        for name, value in reference.items():
            torch.testing.assert_close(final[name], value, rtol=1e-5, atol=1e-6, msg=name)
    initial = _model().state_dict()
    assert all(not torch.equal(final[name], initial[name]) for name in initial)
    predicted = _emulated(stages, predict=True)
    assert not torch.allclose(predicted["body.0.weight"], final["body.0.weight"])  # the first stage predicts
