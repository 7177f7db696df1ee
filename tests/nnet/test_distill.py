"""Teacher–student training (``nnet.models.<name>.teacher``): the objective against its definition, a small student
learning a trained teacher, the config checks and the workflow input."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch.nn import functional as F

from asrflow.nnet.distill import DistillObjective
from asrflow.nnet.models import build_model
from asrflow.nnet.objectives import frame_cross_entropy

from .helpers import synthetic_split

BIG = {"type": "dnn", "hidden": 64, "layers": 2, "context": 2, "dropout": 0.0}
SMALL = {"type": "dnn", "hidden": 8, "layers": 1, "context": 1, "dropout": 0.0}


def _batch() -> dict:
    torch.manual_seed(0)
    targets = torch.randint(0, 5, (2, 30))
    targets[1, 22:] = -100  # padding of the shorter utterance
    return {"feats": torch.randn(2, 30, 12), "lengths": torch.tensor([30, 22]), "targets": targets,
            "target_lengths": torch.tensor([30, 22])}


@pytest.mark.parametrize("temperature", [1.0, 2.5])
def test_the_objective_mixes_cross_entropy_and_the_kl_from_the_teacher(temperature: float) -> None:
    batch = _batch()
    teacher = build_model(BIG, 12, 5).eval()
    student = build_model(SMALL, 12, 5)
    logits, lengths = student(batch["feats"], batch["lengths"])
    cross_entropy, _ = frame_cross_entropy(logits, lengths, batch)
    with torch.no_grad():
        teacher_logits, _ = teacher(batch["feats"], batch["lengths"])
    labelled = batch["targets"] != -100
    kl = F.kl_div(F.log_softmax(logits[labelled] / temperature, -1), F.log_softmax(teacher_logits[labelled]
                  / temperature, -1), log_target=True, reduction="sum") / int(labelled.sum()) * temperature ** 2
    for weight in (0.0, 0.3, 1.0):
        loss, stats = DistillObjective(teacher, weight, temperature)(logits, lengths, batch)
        torch.testing.assert_close(loss, (1 - weight) * cross_entropy + weight * kl)
        torch.testing.assert_close(stats.parts["distill"] / stats.count, kl.detach())
    # a student that is its teacher has nothing left to learn from it
    _, stats = DistillObjective(student, 1.0, temperature)(logits, lengths, batch)
    assert float(stats.parts["distill"]) == pytest.approx(0.0, abs=1e-5)
    with pytest.raises(ValueError, match="do not match the student's"):
        DistillObjective(build_model(BIG, 12, 6), 1.0, 1.0)(logits, lengths, batch)


def test_a_small_student_learns_its_teachers_posteriors(tmp_path: Path) -> None:
    from asrflow.config.settings import Training
    from asrflow.nnet.data import FeatureDataset
    from asrflow.nnet.train import evaluate, train

    labels = synthetic_split(tmp_path, utterances=24)
    data = FeatureDataset(tmp_path / "data", tmp_path / "feats", "train", labels)
    opts = Training.defaults(epochs=3, max_frames=500, lr=1e-2, warmup_steps=2, patience=5, seed=1)
    train(BIG, opts, data, data, 4, tmp_path / "teacher", log=lambda line: None)
    teacher = build_model(BIG, 40, 4)
    teacher.load_state_dict(torch.load(tmp_path / "teacher" / "final.pt", weights_only=True)["model"])
    objective = DistillObjective(teacher, 1.0, 2.0)
    untrained = build_model(SMALL, 40, 4)
    before, _ = evaluate(untrained, data, 500, criterion=objective)
    opts = Training.defaults(epochs=6, max_frames=500, lr=2e-2, warmup_steps=2, patience=6, seed=1)
    summary = train(SMALL, opts, data, data, 4, tmp_path / "student", log=lambda line: None, criterion=objective)
    assert summary["best_valid_loss"] < 0.25 * before, (before, summary)  # held-out: the KL from the teacher
    student = build_model(SMALL, 40, 4)
    student.load_state_dict(torch.load(tmp_path / "student" / "final.pt", weights_only=True)["model"])
    _, accuracy = evaluate(student, data, 500)
    assert accuracy > 0.9  # the teacher's posteriors alone taught it the frame classes


def _config(models: dict) -> dict:
    from asrflow.config import resolve_config

    return resolve_config({"experiment": "x", "corpus": {"name": "yesno"}, "evaluation": {"systems": list(models)},
                           "nnet": {"models": models}})


def test_a_teacher_that_is_not_evaluated_is_trained_or_assembled() -> None:
    from asrflow.config import resolve_config
    from asrflow.workflow import ensemble_systems, trained_networks

    models = {"big": dict(BIG), "big2": dict(BIG), "ens": {"type": "ensemble", "members": ["big", "big2"]},
              "small": {**SMALL, "teacher": {"network": "ens"}}}
    config = resolve_config({"experiment": "x", "corpus": {"name": "yesno"}, "evaluation": {"systems": ["small"]},
                             "nnet": {"models": models}})
    assert ensemble_systems(config) == ["ens"]
    assert trained_networks(config) == ["small", "big", "big2"]


def test_config_checks_the_teacher_and_the_workflow_trains_it_first() -> None:
    from asrflow.config import ConfigError
    from asrflow.workflow import nnet_inputs

    config = _config({"big": dict(BIG), "small": {**SMALL, "teacher": {"network": "big"}}})
    assert config["nnet"]["models"]["small"]["teacher"] == {"network": "big", "weight": 1.0, "temperature": 1.0}
    assert nnet_inputs(config, "train", "small")["teacher"].endswith("/nnet/train/big")
    assert "teacher" not in nnet_inputs(config, "train", "big")
    for models, message in (
            ({"small": {**SMALL, "teacher": {"network": "bog"}}, "big": dict(BIG)}, r"'bog' is not another network"),
            ({"small": {**SMALL, "teacher": {"network": "small"}}}, "'small' is not another network"),
            ({"big": {**BIG, "objective": "ctc", "units": "char"}, "small": {**SMALL, "teacher": {"network": "big"}}},
             "'big' is a ctc network"),
            ({"big": {**BIG, "features": "mfcc"}, "small": {**SMALL, "teacher": {"network": "big"}}},
             "differ in features"),
            ({"big": dict(BIG), "small": {**SMALL, "teacher": {"network": "big"}, "train": {"chunk_frames": 50}}},
             "whole utterances"),
            ({"big": {**BIG, "init": "ft"}, "ft": {**SMALL, "hidden": 64, "layers": 2, "context": 2},
              "small": {**SMALL, "teacher": {"network": "big"}}}, None),
            ({"big": {**BIG, "teacher": {"network": "small"}}, "small": {**SMALL, "teacher": {"network": "big"}}},
             "depends on")):
        if message is None:
            _config(models)  # a teacher fine-tuned from another network is fine
            continue
        with pytest.raises(ConfigError, match=message):
            _config(models)


def test_the_stage_reads_the_teachers_final_model_or_says_what_is_missing(tmp_path: Path) -> None:
    from asrflow.config import settings
    from asrflow.nnet import NnetError
    from asrflow.nnet.stage import distill_criterion

    net = settings.network(_config({"big": dict(BIG), "small": {**SMALL, "teacher": {"network": "big"}}}), "small")
    with pytest.raises(NnetError, match="--teacher must be its trained network folder"):
        distill_criterion(net, tmp_path / "missing", 4, 40)
    model = build_model(BIG, 40, 4)
    torch.save({"model": model.state_dict(), "config": BIG, "objective": "hybrid", "num_classes": 4, "input_dim": 40},
               tmp_path / "final.pt")
    assert isinstance(distill_criterion(net, tmp_path, 4, 40), DistillObjective)
    with pytest.raises(NnetError, match="the teacher has 40-dimensional input and 4 outputs, small 40 and 5"):
        distill_criterion(net, tmp_path, 5, 40)
