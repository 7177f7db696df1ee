"""Low-rank factorisation (``nnet.models.<name>.low_rank``): the truncated SVD against its definition, the
rank choices, the factorised network built back from its config, the config checks, and fine-tuning."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from asrflow.nnet.lowrank import factorisable, factorise, factorised_init, factorised_state, layer_rank
from asrflow.nnet.models import build_model, frame_context, parameter_count

from .helpers import synthetic_split

DNN = {"type": "dnn", "hidden": 48, "layers": 2, "context": 2, "dropout": 0.0}
TDNN = {"type": "cnn", "channels": [], "tdnn_dim": 48, "tdnn_dilations": [1, 2, 3], "dropout": 0.0}
CNN = {"type": "cnn", "channels": [4], "tdnn_dim": 40, "tdnn_dilations": [1, 3], "norm": "layer", "dropout": 0.0}


def _weight(singular: list[float], rows: int = 40, cols: int = 30) -> torch.Tensor:
    """A rows × cols matrix with the given singular values (random orthonormal bases)."""
    torch.manual_seed(0)
    u, _ = torch.linalg.qr(torch.randn(rows, rows, dtype=torch.float64))
    v, _ = torch.linalg.qr(torch.randn(cols, cols, dtype=torch.float64))
    k = len(singular)
    return (u[:, :k] * torch.tensor(singular, dtype=torch.float64)) @ v[:, :k].T


def test_ranks_by_energy_and_by_budget() -> None:
    w = _weight([4.0, 3.0, 2.0, 1.0])  # squared: 16, 9, 4, 1 of 30
    assert [layer_rank(w, energy=e) for e in (0.5, 0.8, 0.9, 1.0)] == [1, 2, 3, 4]
    assert layer_rank(w, keep=0.3) == int(0.3 * 40 * 30 / 70)
    assert layer_rank(torch.randn(6, 6), keep=0.99) == 2  # 2 × (6 + 6) = 24 weights for 36
    assert layer_rank(torch.randn(4, 4), energy=1.0) is None  # full rank: 4 × (4 + 4) = 32 weights for 16
    with pytest.raises(ValueError, match="exactly one"):
        layer_rank(w, energy=0.5, keep=0.5)


@pytest.mark.parametrize("config", [DNN, TDNN, CNN], ids=["dnn", "tdnn", "cnn"])
def test_full_rank_factorisation_computes_the_same_network(config: dict) -> None:
    """Every layer factorised at its full rank, a network gives its own outputs (kernels, dilations, edge padding
    and biases carried over); at a lower rank it does not."""
    torch.manual_seed(0)
    model = build_model(config, 20, 7).eval()
    state = model.state_dict()
    layers = factorisable(model)
    assert set(layers) == ({"body.0", "body.4", "output"} if config["type"] == "dnn"
                           else {f"tdnn.{i}.0" for i in range(len(config["tdnn_dilations"]))} | {"output"})
    x = torch.randn(2, 50, 20)
    lengths = torch.tensor([50, 37])
    for scale, close in ((1.0, True), (0.5, False)):
        ranks = {name: int(scale * min(layer.weight.shape[0], layer.weight[0].numel()))
                 for name, layer in layers.items()}
        low = factorise(build_model(config, 20, 7), ranks).eval()
        low.load_state_dict(factorised_state(state, ranks))
        assert torch.allclose(low(x, lengths)[0], model(x, lengths)[0], atol=1e-4, rtol=1e-4) == close
    assert frame_context(low) == frame_context(model)


def test_truncation_is_the_best_approximation_of_that_rank() -> None:
    """Eckart–Young: the rank-r product misses exactly the dropped singular values' energy, and keeps the bias."""
    layer = torch.nn.Conv1d(30, 40, kernel_size=3, dilation=2, padding=2)
    torch.manual_seed(1)
    state = {"c.weight": torch.randn(40, 30, 3), "c.bias": torch.randn(40)}
    out = factorised_state(state, {"c": 5})
    first, second = out["c.first.weight"], out["c.second.weight"]
    assert first.shape == (5, 30, 3) and second.shape == (40, 5, 1)
    product = (second[:, :, 0] @ first.reshape(5, -1)).double()
    singular = torch.linalg.svdvals(state["c.weight"].reshape(40, -1).double())
    error = ((state["c.weight"].reshape(40, -1).double() - product) ** 2).sum()
    assert float(error) == pytest.approx(float((singular[5:] ** 2).sum()), rel=1e-4)
    assert torch.equal(out["c.second.bias"], state["c.bias"]) and "c.weight" not in out
    assert layer.weight.shape == state["c.weight"].shape  # the layer those weights are for


def test_a_budget_keeps_that_share_of_the_weights_and_the_config_rebuilds_the_network(tmp_path: Path) -> None:
    torch.manual_seed(0)
    config = {**DNN, "hidden": 256}
    model = build_model(config, 40, 100)
    init = {"model": model.state_dict(), "config": config, "input_dim": 40, "num_classes": 100}
    factorised, ranks = factorised_init(init, model, {"keep": 0.3})
    assert set(ranks) == {"body.0", "body.4", "output"}
    rebuilt = build_model({**config, "ranks": ranks}, 40, 100)
    rebuilt.load_state_dict(factorised["model"])  # strict: the same layers and shapes
    whole = sum(p.numel() for n, p in model.named_parameters() if n.endswith("weight") and p.dim() == 2)
    kept = sum(p.numel() for n, p in rebuilt.named_parameters() if ".first." in n or ".second.weight" in n)
    assert 0.28 < kept / whole <= 0.3
    assert parameter_count(rebuilt) < 0.35 * parameter_count(model)
    with pytest.raises(ValueError, match="no linear layer or 1-D convolution named body.9"):
        build_model({**config, "ranks": {"body.9": 3}}, 40, 100)


def test_config_needs_init_and_a_whole_network_to_factorise() -> None:
    from asrflow.config import ConfigError, resolve_config

    def config(models: dict) -> dict:
        return resolve_config({"experiment": "x", "corpus": {"name": "yesno"},
                               "evaluation": {"systems": list(models)}, "nnet": {"models": models}})

    resolved = config({"big": dict(DNN), "small": {**DNN, "init": "big", "low_rank": {"keep": 0.3}}})
    assert resolved["nnet"]["models"]["small"]["low_rank"] == {"keep": 0.3}
    with pytest.raises(ConfigError, match="set nnet.models.small.init"):
        config({"small": {**DNN, "low_rank": {"energy": 0.8}}})
    with pytest.raises(ConfigError, match=r"'small' is compressed \(low_rank\)"):
        config({"big": dict(DNN), "small": {**DNN, "init": "big", "low_rank": {"keep": 0.3}},
                "again": {**DNN, "init": "small"}})
    with pytest.raises(ConfigError, match="low_rank"):
        config({"big": dict(DNN), "small": {**DNN, "init": "big", "low_rank": {"keep": 0.3, "energy": 0.8}}})


def test_a_factorised_network_fine_tunes_from_the_truncated_weights(tmp_path: Path) -> None:
    """Fine-tuning starts from the truncated network (its held-out loss is the one to beat), and final.pt loads
    back as the factorised network."""
    from asrflow.config.settings import Training
    from asrflow.nnet.data import FeatureDataset
    from asrflow.nnet.inference import load_network
    from asrflow.nnet.train import train

    labels = synthetic_split(tmp_path, utterances=24)
    data = FeatureDataset(tmp_path / "data", tmp_path / "feats", "train", labels)
    config = {**DNN, "hidden": 128}
    opts = Training.defaults(epochs=2, max_frames=500, lr=1e-2, warmup_steps=2, patience=5, seed=1)
    train(config, opts, data, data, 4, tmp_path / "big", log=lambda line: None)
    big = torch.load(tmp_path / "big" / "final.pt", weights_only=True)
    init, ranks = factorised_init(big, build_model(config, 40, 4), {"energy": 0.6})
    logged: list[str] = []
    summary = train({**config, "ranks": ranks}, opts, data, data, 4, tmp_path / "small", log=logged.append,
                    init=init)
    start = float(logged[0].split("held-out loss ")[1].split()[0].rstrip(","))
    assert summary["best_valid_loss"] <= start
    model, header = load_network(tmp_path / "small" / "final.pt")
    assert header["config"]["ranks"] == ranks
    assert parameter_count(model) < parameter_count(build_model(config, 40, 4))
