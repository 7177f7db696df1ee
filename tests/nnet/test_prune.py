"""Magnitude pruning (``nnet.models.<name>.prune``): the smallest weights zeroed, the pruned network built back from
its config, the count of its weights, the config checks, and fine-tuning that keeps the pruned weights at zero."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from asrflow.nnet.models import build_model, parameter_count
from asrflow.nnet.prune import packed, pruned_init, pruned_state, unpacked

from .helpers import synthetic_split

DNN = {"type": "dnn", "hidden": 64, "layers": 2, "context": 2, "dropout": 0.0}
TDNN = {"type": "cnn", "channels": [], "tdnn_dim": 48, "tdnn_dilations": [1, 2], "dropout": 0.0}


def test_the_smallest_weights_of_each_layer_go() -> None:
    torch.manual_seed(0)
    state = {"a.weight": torch.randn(30, 20), "a.bias": torch.randn(30), "c.weight": torch.randn(8, 4, 3)}
    out = pruned_state(state, ["a", "c"], 0.7)
    assert torch.equal(out["a.bias"], state["a.bias"]) and "a.weight" not in out
    for name, weight in (("a", state["a.weight"]), ("c", state["c.weight"])):
        mask, kept = out[f"{name}.weight_mask"], out[f"{name}.weight_orig"]
        assert int((mask == 0).sum()) == int(0.7 * weight.numel())
        assert weight.abs()[mask == 1].min() >= weight.abs()[mask == 0].max()
        assert torch.equal(kept, weight * mask)
    with pytest.raises(ValueError, match="between 0 and 1"):
        pruned_state(state, ["a"], 1.0)


@pytest.mark.parametrize("config", [DNN, TDNN], ids=["dnn", "tdnn"])
def test_a_pruned_network_computes_with_the_zeroed_weights_and_counts_the_kept_ones(config: dict) -> None:
    torch.manual_seed(0)
    model = build_model(config, 20, 7).eval()
    init = {"model": model.state_dict(), "config": config, "input_dim": 20, "num_classes": 7}
    pruned, layers = pruned_init(init, model, 0.5)
    rebuilt = build_model({**config, "pruned": layers}, 20, 7).eval()
    rebuilt.load_state_dict(pruned["model"])  # strict: every layer masked, nothing else changed
    reference = build_model(config, 20, 7).eval()  # the same weights zeroed by hand
    reference.load_state_dict({**init["model"], **{f"{n}.weight": pruned["model"][f"{n}.weight_orig"] for n in layers}})
    x, lengths = torch.randn(2, 40, 20), torch.tensor([40, 31])
    torch.testing.assert_close(rebuilt(x, lengths)[0], reference(x, lengths)[0])
    dropped = sum(int((pruned["model"][f"{n}.weight_mask"] == 0).sum()) for n in layers)
    assert dropped > 0 and parameter_count(rebuilt) == parameter_count(model) - dropped
    with pytest.raises(ValueError, match="no linear layer or 1-D convolution named body.1"):
        build_model({**config, "pruned": ["body.1"]}, 20, 7)


def test_config_needs_init_and_one_compression() -> None:
    from asrflow.config import ConfigError, resolve_config

    def config(models: dict) -> dict:
        return resolve_config({"experiment": "x", "corpus": {"name": "yesno"},
                               "evaluation": {"systems": list(models)}, "nnet": {"models": models}})

    assert config({"big": dict(DNN), "p": {**DNN, "init": "big", "prune": {"fraction": 0.7}}}
                  )["nnet"]["models"]["p"]["prune"] == {"fraction": 0.7}
    with pytest.raises(ConfigError, match="set nnet.models.p.init"):
        config({"p": {**DNN, "prune": {"fraction": 0.7}}})
    with pytest.raises(ConfigError, match="low_rank and prune cannot be combined"):
        config({"big": dict(DNN), "p": {**DNN, "init": "big", "prune": {"fraction": 0.7}, "low_rank": {"keep": 0.5}}})
    with pytest.raises(ConfigError, match=r"'p' is compressed \(prune\)"):
        config({"big": dict(DNN), "p": {**DNN, "init": "big", "prune": {"fraction": 0.7}}, "q": {**DNN, "init": "p"}})


def test_fine_tuning_keeps_the_pruned_weights_at_zero(tmp_path: Path) -> None:
    from asrflow.config.settings import Training
    from asrflow.nnet.data import FeatureDataset
    from asrflow.nnet.inference import load_network
    from asrflow.nnet.train import train

    labels = synthetic_split(tmp_path, utterances=24)
    data = FeatureDataset(tmp_path / "data", tmp_path / "feats", "train", labels)
    opts = Training.defaults(epochs=2, max_frames=500, lr=1e-2, warmup_steps=2, patience=5, seed=1)
    train(DNN, opts, data, data, 4, tmp_path / "big", log=lambda line: None)
    big = torch.load(tmp_path / "big" / "final.pt", weights_only=True)
    init, layers = pruned_init(big, build_model(DNN, 40, 4), 0.8)
    logged: list[str] = []
    summary = train({**DNN, "pruned": layers}, opts, data, data, 4, tmp_path / "small", log=logged.append, init=init)
    start = float(logged[0].split("held-out loss ")[1].split()[0].rstrip(","))
    assert summary["best_valid_loss"] < start  # it learnt on from the pruned weights
    model, header = load_network(tmp_path / "small" / "final.pt")
    assert header["config"]["pruned"] == layers
    model(torch.randn(1, 30, 40), torch.tensor([30]))  # a forward pass sets each weight from weight_orig × weight_mask
    for name in layers:
        layer = model.get_submodule(name)
        mask = init["model"][f"{name}.weight_mask"]
        assert torch.equal(layer.weight_mask, mask) and torch.all(layer.weight[mask == 0] == 0)
        assert not torch.equal(layer.weight_orig[mask == 1], init["model"][f"{name}.weight_orig"][mask == 1])
    # stored packed (the kept weights and a bit per weight), it loads back to the same network, in under half the bytes
    saved = torch.load(tmp_path / "small" / "final.pt", weights_only=True)
    compact = {**saved, "model": packed(saved["model"], layers)}
    torch.save(compact, tmp_path / "packed.pt")
    assert (tmp_path / "packed.pt").stat().st_size < 0.5 * (tmp_path / "small" / "final.pt").stat().st_size
    again, _ = load_network(tmp_path / "packed.pt")
    x, lengths = torch.randn(2, 30, 40), torch.tensor([30, 24])
    torch.testing.assert_close(again(x, lengths)[0], model(x, lengths)[0])
    restored = unpacked(compact["model"], layers)
    assert restored.keys() == saved["model"].keys()
    assert all(torch.equal(restored[k], v) for k, v in saved["model"].items())


def test_the_sparse_bench_times_both_products() -> None:
    from asrflow.nnet.prune import sparse_speed

    rows = sparse_speed(64, 96, 50, [0.0, 0.9], repeats=1)
    assert [r["fraction"] for r in rows] == [0.0, 0.9]
    assert all(r["dense_ms"] > 0 and r["sparse_ms"] > 0 and r["threads"] == 1 for r in rows)
