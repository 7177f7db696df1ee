"""Fine-tuning (``nnet.models.<name>.init``): the config checks, the workflow input, and training that starts
from another network's weights and never ends worse on the held-out set than it started."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from .helpers import synthetic_split

NET = {"type": "dnn", "hidden": 32, "layers": 1, "context": 1, "dropout": 0.0}


def _config(models: dict, systems: list[str] | None = None) -> dict:
    from asrflow.config import resolve_config

    return resolve_config({"experiment": "x", "corpus": {"name": "yesno"},
                           "evaluation": {"systems": systems or list(models)}, "nnet": {"models": models}})


def test_config_accepts_init_from_a_network_of_the_same_shape_only() -> None:
    from asrflow.config import ConfigError

    config = _config({"ce": dict(NET), "ft": {**NET, "init": "ce", "train": {"epochs": 2, "mmi": {"weight": 4.0}}}},
                     ["ft"])
    assert config["nnet"]["models"]["ft"]["init"] == "ce"
    with pytest.raises(ConfigError, match=r"'ce2' is not a network in nnet.models \(did you mean 'ce'\?\)"):
        _config({"ce": dict(NET), "ft": {**NET, "init": "ce2"}})
    with pytest.raises(ConfigError, match="their type and sizes differ"):
        _config({"ce": dict(NET), "ft": {**NET, "hidden": 64, "init": "ce"}})
    with pytest.raises(ConfigError, match="their features, alignments differ"):
        _config({"ce": dict(NET), "ft": {**NET, "init": "ce", "features": "mfcc", "alignments": "mono"}})
    with pytest.raises(ConfigError, match="their objective, units differ"):
        _config({"ce": dict(NET), "ft": {**NET, "init": "ce", "objective": "ctc", "units": "char"}})
    with pytest.raises(ConfigError, match="leads back"):
        _config({"a": {**NET, "init": "b"}, "b": {**NET, "init": "a"}})
    with pytest.raises(ConfigError, match="an ensemble"):
        _config({"ce": dict(NET), "other": dict(NET), "ens": {"type": "ensemble", "members": ["ce", "other"]},
                 "ft": {**NET, "init": "ens"}})
    # the type's default sizes count: a network spelling them out has the same shape as one leaving them out
    _config({"ce": {"type": "dnn"}, "ft": {"type": "dnn", "hidden": 512, "layers": 4, "init": "ce"}})


def test_a_fine_tuned_network_waits_for_the_one_it_starts_from() -> None:
    from asrflow.workflow import nnet_inputs

    config = _config({"ce": dict(NET), "ft": {**NET, "init": "ce"}}, ["ft"])
    assert nnet_inputs(config, "train", "ft")["init"].endswith("/nnet/train/ce")
    assert "init" not in nnet_inputs(config, "train", "ce")


def test_the_networks_an_evaluated_one_starts_from_are_trained_though_not_evaluated() -> None:
    from asrflow.workflow import trained_networks, tuned_networks

    config = _config({"ce": dict(NET), "ft": {**NET, "init": "ce"}, "ft2": {**NET, "init": "ft"},
                      "unused": dict(NET)}, ["ft2"])
    assert tuned_networks(config) == ["ft2"]
    assert trained_networks(config) == ["ft2", "ft", "ce"]


def _train(root: Path, labels: dict, out: str, lr: float, init: dict | None = None, epochs: int = 3,
           keep: str = "best") -> dict:
    """Train NET on the synthetic split in ``root`` into ``root/out``: the summary, the log lines, final.pt."""
    from asrflow.config.settings import Training
    from asrflow.nnet.data import FeatureDataset
    from asrflow.nnet.train import train

    data = FeatureDataset(root / "data", root / "feats", "train", labels)
    opts = Training.defaults(epochs=epochs, max_frames=500, lr=lr, warmup_steps=2, patience=5, seed=1,
                                keep=keep)
    logged: list[str] = []
    summary = train(NET, opts, data, data, 4, root / out, log=logged.append, init=init)
    return {**summary, "log": logged, "final": torch.load(root / out / "final.pt", weights_only=True)}


def test_training_starts_from_the_given_weights_and_keeps_them_unless_it_improves(tmp_path: Path) -> None:
    from asrflow.nnet import NnetError

    labels = synthetic_split(tmp_path, utterances=24)
    first = _train(tmp_path, labels, "ce", lr=1e-2, epochs=2)
    # no learning: the starting model stays the best, so final.pt is its weights exactly
    frozen = _train(tmp_path, labels, "frozen", lr=0.0, init=first["final"])
    assert frozen["log"][0].startswith("initial weights: held-out loss")
    for name, value in first["final"]["model"].items():
        assert torch.equal(value, frozen["final"]["model"][name]), name
    assert frozen["best_valid_loss"] == pytest.approx(first["best_valid_loss"], rel=1e-6)
    # learning on from there: better than the start, never worse
    tuned = _train(tmp_path, labels, "tuned", lr=1e-2, init=first["final"])
    assert tuned["best_valid_loss"] < first["best_valid_loss"]
    with pytest.raises(NnetError, match="5 classes; this network has 40-dimensional input and 4 classes"):
        _train(tmp_path, labels, "wrong", lr=1e-2, init={**first["final"], "num_classes": 5})


def test_keep_last_writes_the_last_epochs_weights_even_when_the_held_out_loss_rose(tmp_path: Path) -> None:
    labels = synthetic_split(tmp_path, utterances=24)
    first = _train(tmp_path, labels, "ce", lr=1e-2, epochs=2)
    # a rate far too high: the epoch ends worse on the held-out set than its starting weights
    kept = _train(tmp_path, labels, "best", lr=5.0, init=first["final"], epochs=1)
    last = _train(tmp_path, labels, "last", lr=5.0, init=first["final"], epochs=1, keep="last")
    assert kept["final_valid_loss"] == kept["best_valid_loss"] == last["best_valid_loss"]
    assert last["final_valid_loss"] > last["best_valid_loss"]
    assert all(torch.equal(value, kept["final"]["model"][name]) for name, value in first["final"]["model"].items())
    assert not all(torch.equal(value, last["final"]["model"][name]) for name, value in first["final"]["model"].items())


def test_the_stage_reads_the_init_networks_final_model_or_says_what_is_missing(tmp_path: Path) -> None:
    from asrflow.nnet import NnetError
    from asrflow.nnet.stage import initial_weights
    from asrflow.nnet.train import weights_digest

    config = _config({"ce": dict(NET), "ft": {**NET, "init": "ce"}, "big": {**NET, "hidden": 64}})
    assert initial_weights(config, "ce", None) is None
    with pytest.raises(NnetError, match="ce has no init"):
        initial_weights(config, "ce", tmp_path)
    with pytest.raises(NnetError, match="--init must be ce's trained network folder"):
        initial_weights(config, "ft", tmp_path / "missing")
    weights = {"w": torch.ones(2, 2), "steps": torch.tensor(3)}
    torch.save({"model": weights, "config": {**NET, "hidden": 64}, "objective": "hybrid", "num_classes": 4,
                "input_dim": 40}, tmp_path / "final.pt")
    with pytest.raises(NnetError, match="retrain ce"):
        initial_weights(config, "ft", tmp_path)
    torch.save({"model": weights, "config": dict(NET), "objective": "hybrid", "num_classes": 4, "input_dim": 40},
               tmp_path / "final.pt")
    assert initial_weights(config, "ft", tmp_path)["num_classes"] == 4
    # a checkpoint resumes only onto the same starting weights
    assert weights_digest(weights) == weights_digest({k: v.clone() for k, v in weights.items()})
    assert weights_digest(weights) != weights_digest({**weights, "w": torch.full((2, 2), 2.0)})


def test_config_lets_a_network_on_anothers_encoder_have_outputs_of_its_own() -> None:
    from asrflow.config import ConfigError

    models = {"phones": {**NET, "objective": "ctc", "units": "phone"},
              "bpe": {**NET, "objective": "ctc", "units": "bpe", "init": "phones", "init_layers": "encoder"},
              "tri": {**NET, "alignments": "tri", "init": "phones", "init_layers": "encoder"}}
    config = _config(models, ["bpe", "tri"])
    assert config["nnet"]["models"]["bpe"]["init_layers"] == "encoder"
    assert "init_layers" not in config["nnet"]["models"]["phones"]  # absent: every layer, as before
    with pytest.raises(ConfigError, match="their type and sizes differ .a network on another's encoder"):
        _config({**models, "bpe": {**models["bpe"], "hidden": 64}}, ["bpe"])
    with pytest.raises(ConfigError, match="their features differ"):
        _config({**models, "bpe": {**models["bpe"], "features": "mfcc"}}, ["bpe"])
    with pytest.raises(ConfigError, match="init_layers': encoder gives a new output layer to train; not with "
                                          "train.epochs 0"):
        _config({**models, "bpe": {**models["bpe"], "train": {"epochs": 0}}}, ["bpe"])
    with pytest.raises(ConfigError, match="not with low_rank"):
        _config({**models, "bpe": {**models["bpe"], "low_rank": {"keep": 0.5}}}, ["bpe"])
    with pytest.raises(ConfigError, match="init_layers': it says what init gives"):
        _config({"ce": {**NET, "init_layers": "encoder"}})
    with pytest.raises(ConfigError, match="their objective, units differ .* with init_layers: encoder, only"):
        _config({"ce": dict(NET), "ft": {**NET, "init": "ce", "objective": "ctc", "units": "char"}})


def test_a_new_output_layer_trains_on_the_init_networks_encoder(tmp_path: Path) -> None:
    """init_layers: encoder: the stage gives the layers below the output; training starts from them exactly, with
    a new output layer of the network's own classes, and learns the new task from there."""
    from asrflow.config.settings import Training
    from asrflow.nnet import NnetError
    from asrflow.nnet.data import FeatureDataset
    from asrflow.nnet.stage import initial_weights
    from asrflow.nnet.train import train

    labels = synthetic_split(tmp_path, utterances=24)
    first = _train(tmp_path, labels, "ce", lr=1e-2, epochs=2)
    torch.save(first["final"], tmp_path / "ce" / "final.pt")
    config = _config({"ce": dict(NET), "six": {**NET, "init": "ce", "init_layers": "encoder"}}, ["six"])
    encoder = initial_weights(config, "six", tmp_path / "ce")
    assert encoder["num_classes"] is None and not any(k.startswith("output.") for k in encoder["model"])
    assert set(first["final"]["model"]) - set(encoder["model"]) == {"output.weight", "output.bias"}
    shifted = {u: c + 2 for u, c in labels.items()}  # six classes, of which the four seen, renamed

    def run(out: str, lr: float, init: dict | None) -> dict:
        data = FeatureDataset(tmp_path / "data", tmp_path / "feats", "train", shifted)
        opts = Training.defaults(epochs=2, max_frames=500, lr=lr, warmup_steps=2, patience=5, seed=1)
        logged: list[str] = []
        summary = train(NET, opts, data, data, 6, tmp_path / out, log=logged.append, init=init)
        return {**summary, "log": logged, "final": torch.load(tmp_path / out / "final.pt", weights_only=True)}

    frozen = run("frozen", 0.0, encoder)
    assert frozen["final"]["model"]["output.weight"].shape[0] == 6
    assert all(torch.equal(value, frozen["final"]["model"][name]) for name, value in encoder["model"].items())
    transferred = run("transferred", 1e-2, encoder)
    start = float(transferred["log"][0].split("held-out loss ")[1].split(",")[0])  # the new output's, at random
    assert transferred["best_valid_loss"] < 0.5 * start and transferred["best_valid_frame_accuracy"] > 0.9
    with pytest.raises(NnetError, match="do not fit this network's layers below its output"):
        run("wrong", 3e-3, {**encoder, "model": {**encoder["model"], "extra.weight": torch.zeros(1)}})
