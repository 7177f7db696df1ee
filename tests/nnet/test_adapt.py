"""Adapted networks (``type: adapted``): the config checks, the workflow's inputs, and the pieces of
adapting a hybrid to each test speaker on its first-pass hypotheses."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from .helpers import synthetic_split

NET = {"type": "dnn", "hidden": 32, "layers": 1, "context": 1, "dropout": 0.0}


def _config(models: dict, systems: list[str] | None = None, train: dict | None = None) -> dict:
    from asrflow.config import resolve_config

    return resolve_config({"experiment": "x", "corpus": {"name": "yesno"}, "audio": {"speed_perturb": [0.9, 1.0]},
                           "evaluation": {"systems": systems or list(models)},
                           "nnet": {"models": models, **({"train": train} if train else {})}})


def test_config_of_an_adapted_network() -> None:
    from asrflow.config import ConfigError, model_features, model_train

    config = _config({"dnn": {**NET, "features": "mfcc"}, "sa": {"type": "adapted", "source": "dnn",
                                                                 "train": {"epochs": 2}}},
                     ["dnn", "sa"], train={"epochs": 15, "lr": 0.002, "speed_perturb": True,
                                           "edge_fragments": {"probability": 1.0}, "mmi": {"weight": 4.0}})
    train = model_train(config, "sa")
    # the adaptation defaults over nnet.train, the network's own overrides over them; no copies, fragments or MMI
    assert (train["epochs"], train["lr"], train["schedule"], train["warmup_steps"]) == (2, 0.0005, "newbob", 1)
    assert not train["speed_perturb"] and train["edge_fragments"]["probability"] == 0.0
    assert train["mmi"]["weight"] == 0.0
    assert model_train(config, "dnn")["epochs"] == 15
    assert model_features(config, "sa") == "mfcc"  # the source's
    assert config["nnet"]["models"]["sa"]["rounds"] == 1
    assert _config({"dnn": dict(NET), "sa": {"type": "adapted", "source": "dnn", "rounds": 2}})["nnet"]["models"][
        "sa"]["rounds"] == 2
    with pytest.raises(ConfigError, match=r"'dnx' is not a network in nnet.models \(did you mean 'dnn'\?\)"):
        _config({"dnn": dict(NET), "sa": {"type": "adapted", "source": "dnx"}})
    with pytest.raises(ConfigError, match="needs a source"):
        _config({"dnn": dict(NET), "sa": {"type": "adapted"}})
    with pytest.raises(ConfigError, match="hidden not allowed"):
        _config({"dnn": dict(NET), "sa": {"type": "adapted", "source": "dnn", "hidden": 64}})
    with pytest.raises(ConfigError, match="not a trained hybrid network"):
        _config({"ctc": {**NET, "objective": "ctc", "units": "char"}, "sa": {"type": "adapted", "source": "ctc"}})
    with pytest.raises(ConfigError, match="not a trained hybrid network"):
        _config({"dnn": dict(NET), "a": {"type": "adapted", "source": "dnn"},
                 "b": {"type": "adapted", "source": "a"}})
    with pytest.raises(ConfigError, match="speed_perturb cannot be used"):
        _config({"dnn": dict(NET), "sa": {"type": "adapted", "source": "dnn", "train": {"speed_perturb": True}}})
    with pytest.raises(ConfigError, match="only an adapted network has a source"):
        _config({"dnn": {**NET, "source": "x"}})
    with pytest.raises(ConfigError, match="init not allowed"):
        _config({"dnn": dict(NET), "sa": {"type": "adapted", "source": "dnn", "init": "dnn"}})
    with pytest.raises(ConfigError, match="'sa' is an adapted network; init names one trained network"):
        _config({"dnn": dict(NET), "sa": {"type": "adapted", "source": "dnn"}, "ft": {**NET, "init": "sa"}})


def test_an_adapted_network_decodes_with_its_sources_network_and_settings() -> None:
    from asrflow.workflow import (decode_nnet_fingerprint, nnet_decode_inputs, trained_networks, tuned_networks)

    config = _config({"dnn": dict(NET), "sa": {"type": "adapted", "source": "dnn"}}, ["sa"])
    assert trained_networks(config) == tuned_networks(config) == ["dnn"]  # the source, though not evaluated
    inputs = nnet_decode_inputs(config, "test", "sa")
    assert inputs["model"].endswith("/nnet/train/dnn") and inputs["tune"].endswith("/tune/train/dnn")
    assert inputs["graph"].endswith("/graph/train/tri")
    # the fine-tuning's settings are the adapted network's decode fingerprint; the source's is not moved by them
    other = _config({"dnn": dict(NET), "sa": {"type": "adapted", "source": "dnn", "train": {"epochs": 5}}}, ["sa"])
    assert decode_nnet_fingerprint(config, "sa") != decode_nnet_fingerprint(other, "sa")
    assert decode_nnet_fingerprint(config, "dnn") == decode_nnet_fingerprint(other, "dnn")


def test_first_pass_targets_speakers_and_the_merged_result() -> None:
    from asrflow.decode.decoder import DecodeResult
    from asrflow.nnet.adapt import first_pass_targets, merged_result, speakers_of

    tid2pdf = np.array([0, 0, 1, 1, 2])
    first = [DecodeResult({"a-1": ["yes"], "a-2": [], "b-1": ["no"]}, ["a-2"], 30, 1.0,
                          {"a-1": np.array([1, 2, 4]), "b-1": np.array([3, 3, 4])})]
    targets = first_pass_targets(first, tid2pdf)
    assert sorted(targets) == ["a-1", "b-1"]  # no words: no targets
    assert targets["a-1"].tolist() == [0, 1, 2] and targets["a-1"].dtype == np.int64
    speakers = speakers_of(["b-1", "a-2", "a-1"], {"a-1": "a", "a-2": "a", "b-1": "b"})
    assert speakers == {"a": ["a-1", "a-2"], "b": ["b-1"]}
    second = {"a": DecodeResult({"a-1": ["no"], "a-2": ["yes"]}, [], 20, 2.0)}
    merged = merged_result(first, second, speakers, extra_seconds=4.0)
    assert merged.hyps == {"a-1": ["no"], "a-2": ["yes"], "b-1": ["no"]}  # speaker b keeps its first pass
    assert merged.failed == [] and merged.frames == 30 and merged.seconds == 7.0


def test_adapting_a_speaker_fits_its_targets_and_keeps_the_source_otherwise(tmp_path: Path) -> None:
    from asrflow.nnet.adapt import adapt_speaker
    from asrflow.nnet.data import FeatureDataset
    from asrflow.nnet.train import TrainOptions, train

    labels = synthetic_split(tmp_path, utterances=36)
    source_dir = tmp_path / "source"
    opts = TrainOptions(epochs=1, max_frames=500, lr=1e-2, warmup_steps=2, patience=5, seed=1)
    data = FeatureDataset(tmp_path / "data", tmp_path / "feats", "train", labels)
    train(NET, opts, data, data, 4, source_dir, log=lambda _: None, extra={"priors": torch.zeros(4)})
    np.save(source_dir / "priors.npy", np.log(np.full(4, 0.25)))
    source = torch.load(source_dir / "final.pt", weights_only=True)
    config = _config({"dnn": dict(NET), "sa": {"type": "adapted", "source": "dnn",
                                                "train": {"epochs": 3, "lr": 0.01, "max_frames": 500}}}, ["sa"])
    spk0 = sorted(u for u in labels if u.startswith("spk0-"))
    logged: list[str] = []
    info = adapt_speaker(config, "sa", source_dir, source, tmp_path / "data", tmp_path / "feats", "train", spk0,
                         labels, tmp_path / "spk0", log=logged.append)
    assert info["utterances"] == len(spk0) and 1 <= info["held_out"] < len(spk0)
    start = float(logged[0].split("held-out loss ")[1].split(",")[0])
    assert info["held_out_loss"] <= start  # never worse than the source on its speaker's held-out targets
    adapted = torch.load(tmp_path / "spk0" / "final.pt", weights_only=True)
    assert adapted["config"] == source["config"] and torch.equal(adapted["priors"], source["priors"])
    assert np.array_equal(np.load(tmp_path / "spk0" / "priors.npy"), np.load(source_dir / "priors.npy"))
    # one utterance with targets leaves nothing to hold out: no adaptation
    assert adapt_speaker(config, "sa", source_dir, source, tmp_path / "data", tmp_path / "feats", "train", spk0,
                         {spk0[0]: labels[spk0[0]]}, tmp_path / "none") is None


def test_an_ensemble_is_adapted_as_one_network(tmp_path: Path) -> None:
    """Adapting an ensemble fine-tunes its members together on the ensemble's own first-pass targets."""
    from asrflow.nnet.adapt import adapt_speaker
    from asrflow.nnet.data import FeatureDataset
    from asrflow.nnet.ensemble import combined_checkpoint
    from asrflow.nnet.train import TrainOptions, train
    from asrflow.workflow import nnet_decode_inputs

    labels = synthetic_split(tmp_path, utterances=36)
    data = FeatureDataset(tmp_path / "data", tmp_path / "feats", "train", labels)
    members = []
    for seed in (1, 2):
        opts = TrainOptions(epochs=1, max_frames=500, lr=1e-2, warmup_steps=2, patience=5, seed=seed)
        train(NET, opts, data, data, 4, tmp_path / f"m{seed}", log=lambda _: None, extra={"priors": torch.zeros(4)})
        members.append(torch.load(tmp_path / f"m{seed}" / "final.pt", weights_only=True))
    saved, _ = combined_checkpoint(members, ["a", "b"], "log_linear")
    (tmp_path / "ens").mkdir()
    torch.save(saved, tmp_path / "ens" / "final.pt")
    np.save(tmp_path / "ens" / "priors.npy", np.log(np.full(4, 0.25)))
    adapt = {"epochs": 2, "lr": 0.01, "max_frames": 500}
    config = _config({"a": dict(NET), "b": {**NET, "train": {"seed": 2}},
                      "ens": {"type": "ensemble", "members": ["a", "b"]},
                      "sa": {"type": "adapted", "source": "ens", "train": adapt}}, ["sa"])
    assert nnet_decode_inputs(config, "test", "sa")["model"].endswith("/nnet/train/ens")
    spk0 = sorted(u for u in labels if u.startswith("spk0-"))
    info = adapt_speaker(config, "sa", tmp_path / "ens", saved, tmp_path / "data", tmp_path / "feats", "train", spk0,
                         labels, tmp_path / "spk0", log=lambda _: None)
    assert info["utterances"] == len(spk0) and info["epochs"] >= 1
    adapted = torch.load(tmp_path / "spk0" / "final.pt", weights_only=True)
    assert adapted["config"] == saved["config"] and adapted["config"]["type"] == "ensemble"
    assert set(adapted["model"]) == set(saved["model"])  # both members' weights, fine-tuned together
