"""Ensembles: the frame-level combination, assembling members' final.pt, and the config checks."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from asrflow.config import ConfigError, resolve_config
from asrflow.nnet import NnetError
from asrflow.nnet.ensemble import assemble
from asrflow.nnet.inference import batch_log_posteriors, load_network
from asrflow.nnet.models import build_model
from asrflow.workflow import ensemble_inputs, ensemble_systems, trained_networks

REQUIRED = {"experiment": "t", "corpus": {"name": "yesno"}}
MEMBERS = {"dnn": {"type": "dnn", "hidden": 16, "layers": 1, "context": 2},
           "cnn": {"type": "cnn", "channels": [4], "tdnn_dim": 16, "tdnn_dilations": [1, 2]}}


def ensemble_config(combine: str = "log_linear", evaluated: tuple[str, ...] = ("ens",)) -> dict:
    return resolve_config({**REQUIRED,
                           "nnet": {"models": {**MEMBERS, "ens": {"type": "ensemble", "members": ["dnn", "cnn"],
                                                                  "combine": combine}}},
                           "evaluation": {"systems": list(evaluated)}})


def write_member(folder: Path, name: str, priors: torch.Tensor, input_dim: int = 6, classes: int = 5) -> Path:
    """A member folder as the nnet stage writes it: final.pt with random weights, priors, manifest, report."""
    torch.manual_seed(len(name))
    config = {**MEMBERS[name], "objective": "hybrid", "train": {}, "parallel": {}}
    model = build_model(config, input_dim, classes)
    out = folder / name
    out.mkdir(parents=True)
    torch.save({"model": model.state_dict(), "config": config, "num_classes": classes, "input_dim": input_dim,
                "objective": "hybrid", "priors": priors}, out / "final.pt")
    (out / "manifest.json").write_text(json.dumps({"train": "train", "seconds": 2.5}))
    (out / "report.tsv").write_text("utterance\treason\nu1\tno alignment\n")
    return out


@pytest.mark.parametrize("combine", ["log_linear", "linear"])
def test_combination_is_the_mean_of_the_members(combine: str) -> None:
    torch.manual_seed(0)
    members = [build_model(MEMBERS[n], 6, 5).eval() for n in ("dnn", "cnn")]
    ensemble = build_model({"type": "ensemble", "members": list(MEMBERS.values()), "combine": combine}, 6, 5).eval()
    for mine, theirs in zip(ensemble.members, members):
        mine.load_state_dict(theirs.state_dict())
    x, lengths = torch.randn(2, 11, 6), torch.tensor([11, 7])
    with torch.no_grad():
        log_post = torch.stack([torch.log_softmax(m(x, lengths)[0], dim=-1) for m in members])
        out, out_lengths = ensemble(x, lengths)
    expected = log_post.mean(0) if combine == "log_linear" else torch.log(log_post.exp().mean(0))
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)
    assert out_lengths.tolist() == [11, 7]
    if combine == "linear":  # already normalised; log-linear is normalised by the consumers' log_softmax
        torch.testing.assert_close(out.exp().sum(-1), torch.ones(2, 11))


def test_an_ensemble_needs_two_members_and_a_known_rule() -> None:
    with pytest.raises(ValueError, match="at least two"):
        build_model({"type": "ensemble", "members": [MEMBERS["dnn"]]}, 6, 5)
    with pytest.raises(ValueError, match="unknown combine 'max'"):
        build_model({"type": "ensemble", "members": list(MEMBERS.values()), "combine": "max"}, 6, 5)


def test_assemble_writes_a_network_that_decodes_as_the_mean(tmp_path: Path) -> None:
    priors = torch.log(torch.tensor([0.1, 0.2, 0.3, 0.2, 0.2]))
    dirs = [write_member(tmp_path, n, priors) for n in ("dnn", "cnn")]
    manifest = assemble(ensemble_config(), "ens", dirs, tmp_path / "ens", log=lambda m: None)
    assert manifest["members"] == ["dnn", "cnn"] and manifest["seconds"] == 5.0
    assert manifest["parameters"] == sum(sum(p.numel() for p in load_network(d / "final.pt")[0].parameters())
                                         for d in dirs)
    np.testing.assert_allclose(np.load(tmp_path / "ens" / "priors.npy"), priors.numpy())
    assert (tmp_path / "ens" / "report.tsv").read_text().splitlines() == ["utterance\treason", "u1\tno alignment"]
    network, header = load_network(tmp_path / "ens" / "final.pt")
    assert header["objective"] == "hybrid" and header["member_names"] == ["dnn", "cnn"]
    feats = [np.random.default_rng(0).standard_normal((n, 6)).astype(np.float32) for n in (9, 14)]
    combined = batch_log_posteriors(network, feats)
    parts = [batch_log_posteriors(load_network(d / "final.pt")[0], feats) for d in dirs]
    for i in range(len(feats)):
        mean = (parts[0][i] + parts[1][i]) / 2
        expected = mean - np.log(np.exp(mean).sum(1, keepdims=True))
        np.testing.assert_allclose(combined[i], expected, atol=1e-5)


def test_members_trained_on_other_alignments_are_refused(tmp_path: Path) -> None:
    write_member(tmp_path, "dnn", torch.log(torch.full((5,), 0.2)))
    write_member(tmp_path, "cnn", torch.log(torch.tensor([0.1, 0.2, 0.3, 0.2, 0.2])))
    with pytest.raises(NnetError, match="different pdf priors"):
        assemble(ensemble_config(), "ens", [tmp_path / "dnn", tmp_path / "cnn"], tmp_path / "ens")
    with pytest.raises(NnetError, match="has members dnn, cnn; got the folders of cnn, dnn"):
        assemble(ensemble_config(), "ens", [tmp_path / "cnn", tmp_path / "dnn"], tmp_path / "ens")
    with pytest.raises(NnetError, match="no final.pt"):
        assemble(ensemble_config(), "ens", [tmp_path / "dnn", tmp_path / "none" / "cnn"], tmp_path / "ens")


@pytest.mark.parametrize("combine", ["log_linear", "linear"])
def test_members_with_posterior_priors_combine_them_as_their_posteriors(tmp_path: Path, combine: str) -> None:
    """nnet.priors: posteriors gives each member its own priors (final.pt keeps the alignments' as
    alignment_priors, which must agree): the ensemble divides by their geometric mean (log_linear, renormalised)
    or their mean (linear)."""
    aligned = torch.log(torch.tensor([0.1, 0.2, 0.3, 0.2, 0.2], dtype=torch.float64))
    own = {"dnn": torch.log(torch.tensor([0.2, 0.2, 0.2, 0.2, 0.2], dtype=torch.float64)),
           "cnn": torch.log(torch.tensor([0.05, 0.15, 0.4, 0.2, 0.2], dtype=torch.float64))}
    dirs = []
    for name in ("dnn", "cnn"):
        out = write_member(tmp_path, name, own[name])
        saved = torch.load(out / "final.pt", weights_only=True)
        torch.save({**saved, "alignment_priors": aligned}, out / "final.pt")
        dirs.append(out)
    assemble(ensemble_config(combine), "ens", dirs, tmp_path / "ens", log=lambda m: None)
    probs = torch.stack([own["dnn"].exp(), own["cnn"].exp()])
    if combine == "linear":
        expected = probs.mean(0)
    else:
        expected = probs.log().mean(0).exp()
        expected = expected / expected.sum()
    np.testing.assert_allclose(np.exp(np.load(tmp_path / "ens" / "priors.npy")), expected.numpy(), rtol=1e-6)
    _, header = load_network(tmp_path / "ens" / "final.pt")
    torch.testing.assert_close(header["alignment_priors"], aligned)
    # members trained on other alignments are still refused, whatever their own priors
    saved = torch.load(dirs[1] / "final.pt", weights_only=True)
    torch.save({**saved, "alignment_priors": own["cnn"]}, dirs[1] / "final.pt")
    with pytest.raises(NnetError, match="different pdf priors"):
        assemble(ensemble_config(combine), "ens", dirs, tmp_path / "ens2")


@pytest.mark.parametrize("models, message", [
    ({"ens": {"type": "ensemble", "members": ["dnn", "cn"]}},
     "'cn' is not a network in nnet.models .did you mean 'cnn'"),
    ({"ctc": {"type": "cnn", "objective": "ctc"}, "ens": {"type": "ensemble", "members": ["dnn", "ctc"]}},
     "'ctc' is not a hybrid network"),
    ({"ens": {"type": "ensemble"}}, "an ensemble needs members"),
    ({"dnn": {"type": "dnn", "combine": "linear"}}, "only an ensemble has combine"),
])
def test_ensemble_config_errors_name_the_key(models: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        resolve_config({**REQUIRED, "nnet": {"models": {**MEMBERS, **models}}})


def test_members_are_trained_even_when_only_the_ensemble_is_evaluated() -> None:
    config = ensemble_config(evaluated=("mono", "ens"))
    assert config["nnet"]["models"]["ens"]["combine"] == "log_linear"
    assert ensemble_systems(config) == ["ens"]
    assert trained_networks(config) == ["dnn", "cnn"]
    inputs = ensemble_inputs(config, "train", "ens")
    assert inputs["members"][0].endswith("/nnet/train/dnn") and inputs["gmm"].endswith("/gmm/train/tri")
    assert len(inputs["members"]) == 2


def test_a_network_seed_overrides_the_experiment_seed() -> None:
    from asrflow.nnet.stage import train_options

    config = resolve_config({**REQUIRED, "seed": 3, "nnet": {"models": {
        "a": {"type": "dnn"}, "b": {"type": "dnn", "train": {"seed": 7}}}}})
    assert train_options(config, "a").seed == 3 and train_options(config, "b").seed == 7
    assert config["nnet"]["train"]["seed"] is None
