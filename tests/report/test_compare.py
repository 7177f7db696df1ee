"""The comparison table from MLflow run records (no MLflow needed)."""

from __future__ import annotations

from asrflow.report.compare import csv_text, markdown, system_rows, table
from asrflow.tracking.query import RunRecord, latest_by_stage


def _run(stage: str, start: int, metrics: dict, params: dict | None = None, **tags: str) -> RunRecord:
    return RunRecord(f"id-{stage}-{start}", stage, start, {f"asrflow.{k}": v for k, v in tags.items()},
                     params or {}, metrics)


def test_rows_take_the_newest_run_and_format_the_table() -> None:
    runs = [
        _run("gmm-tri-train", 1, {"seconds": 25.0, "parameters": 1000}, {"gmm.tri.leaves": "300"}),
        _run("nnet-dnn-train", 2, {"seconds": 60.0, "parameters": 12345, "mean_frames_per_second": 50000.0},
             {"nnet.models.dnn.type": "dnn", "nnet.models.dnn.objective": "hybrid", "nnet.models.dnn.hidden": "512"}),
        _run("score-tri-test", 3, {"wer": 0.010, "ser": 0.02, "rtf": 0.01}),
        _run("score-dnn-test", 4, {"wer": 0.020, "ser": 0.03, "rtf": 0.02}),
        _run("score-dnn-test", 9, {"wer": 0.005, "ser": 0.01, "rtf": 0.03}),  # a rerun: newest wins
        _run("score-dnn-loso_a_test", 5, {"wer": 0.1, "ser": 0.2}),
        _run("score-dnn-loso_b_test", 6, {"wer": 0.2, "ser": 0.3}),
    ]
    rows = system_rows(latest_by_stage(runs), ["tri", "dnn"], ["test", "loso_a_test", "loso_b_test"])
    header, body = table(rows, ["test", "loso_a_test", "loso_b_test"])
    assert header[:4] == ["system", "model", "objective", "sizes"] and "WER LOSO mean" in header
    tri, dnn = (dict(zip(header, line)) for line in body)
    assert dnn["WER test"] == "0.50" and dnn["WER LOSO mean"] == "15.00" and dnn["decode RTF"] == "0.0300"
    assert dnn["sizes"] == "hidden=512" and dnn["parameters"] == "12,345" and dnn["train frames/s"] == "50,000"
    assert "model MB" not in header  # no network logged its size
    assert tri["model"] == "gmm-hmm (tri)" and tri["sizes"] == "leaves=300" and tri["WER LOSO mean"] == ""
    assert markdown(header, body).count("\n") == 4
    assert csv_text(header, body).splitlines()[2].split(",")[-1] == "12345"


def test_the_objective_names_the_training_data_and_augmentation() -> None:
    """A speed-perturbed network and ones trained with MMI, or fine-tuned, say so in the objective column."""
    runs = [
        _run("nnet-a-train", 1, {}, {"nnet.models.a.type": "dnn", "nnet.effective.train_data": "train_sp"}),
        _run("nnet-b-train", 2, {}, {"nnet.models.b.type": "dnn", "nnet.effective.train_data": "train"}),
        _run("nnet-c-train", 3, {}, {"nnet.models.c.type": "dnn"}),  # logged before the setting existed
        _run("nnet-d-train", 4, {}, {"nnet.models.d.type": "dnn",
                                     "nnet.effective.mmi": "{'weight': 4.0, 'acoustic_scale': 0.1}"}),
        _run("nnet-e-train", 5, {}, {"nnet.models.e.type": "dnn", "nnet.effective.mmi":
                                     "{'weight': 1.0, 'acoustic_scale': 0.1, 'denominator': 'phone_lm', "
                                     "'phone_lm_order': 2}"}),
        _run("nnet-f-train", 6, {}, {"nnet.models.f.type": "dnn", "nnet.effective.init": "d",
                                     "nnet.effective.mmi": "{'weight': 4.0, 'acoustic_scale': 0.1}"}),
        _run("nnet-g-train", 7, {}, {"nnet.models.g.type": "dnn", "nnet.effective.init": "none"}),
        _run("nnet-h-train", 8, {}, {"nnet.models.h.type": "dnn", "nnet.effective.init": "g",
                                     "nnet.effective.low_rank": "keep 0.3", "nnet.effective.prune": "none"}),
        _run("nnet-i-train", 9, {}, {"nnet.models.i.type": "dnn", "nnet.effective.init": "g",
                                     "nnet.effective.low_rank": "none", "nnet.effective.prune": "0.7"}),
        _run("nnet-j-train", 10, {}, {"nnet.models.j.type": "dnn", "nnet.effective.teacher": "g"}),
    ]
    systems = ["a", "b", "c", "d", "e", "f", "g", "h", "i", "j"]
    header, body = table(system_rows(latest_by_stage(runs), systems, ["test"]), ["test"])
    objective = [dict(zip(header, line))["objective"] for line in body]
    assert objective == ["hybrid, speed-perturbed data", "hybrid", "hybrid", "hybrid, MMI (w=4)",
                         "hybrid, MMI (w=1, phone LM 2)", "hybrid, MMI (w=4), fine-tuned from d", "hybrid",
                         "hybrid, SVD (keep 0.3) of g, fine-tuned", "hybrid, 70% pruned from g, fine-tuned",
                         "hybrid, taught by g"]


def test_networks_show_their_held_out_wer() -> None:
    """The tune stage's held-out WER is a column; a GMM leaves it empty."""
    runs = [
        _run("gmm-tri-train", 1, {"seconds": 2.0}),
        _run("nnet-dnn-train", 2, {}, {"nnet.models.dnn.type": "dnn"}),
        _run("tune-dnn-train", 3, {"held_out_wer": 0.02}),
        _run("tune-dnn-loso_a_train", 4, {"held_out_wer": 0.5}),  # another split's
    ]
    header, body = table(system_rows(latest_by_stage(runs), ["tri", "dnn"], ["test"]), ["test"])
    tri, dnn = (dict(zip(header, line)) for line in body)
    assert dnn["held-out WER %"] == "2.00"
    assert tri["held-out WER %"] == ""


def test_networks_show_their_size_on_disk() -> None:
    runs = [_run("gmm-tri-train", 1, {"seconds": 2.0}),
            _run("nnet-dnn-train", 2, {"model_bytes": 2_345_678}, {"nnet.models.dnn.type": "dnn"})]
    header, body = table(system_rows(latest_by_stage(runs), ["tri", "dnn"], ["test"]), ["test"])
    tri, dnn = (dict(zip(header, line)) for line in body)
    assert (tri["model MB"], dnn["model MB"]) == ("", "2.35")


def test_a_decoding_variant_names_its_network_and_its_decoding() -> None:
    params = {"nnet.models.fast.type": "dnn", "nnet.models.fast.hidden": "384", "nnet.models.fast.multi_frame": "1",
              "nnet.models.fast.decode.frame_skip": "2", "nnet.effective.init": "dnn", "nnet.effective.epochs": "0"}
    runs = [_run("nnet-fast-train", 1, {"seconds": 0.0}, params),
            _run("nnet-mf-train", 2, {"seconds": 9.0},
                 {"nnet.models.mf.type": "dnn", "nnet.models.mf.multi_frame": "3", "nnet.effective.init": "dnn",
                  "nnet.effective.epochs": "2"})]
    header, body = table(system_rows(latest_by_stage(runs), ["fast", "mf"], ["test"]), ["test"])
    fast, mf = (dict(zip(header, line)) for line in body)
    assert fast["objective"] == "hybrid, dnn as trained, decoded with frame_skip 2"
    assert "multi_frame" not in fast["sizes"]
    assert mf["objective"] == "hybrid, fine-tuned from dnn" and mf["sizes"] == "multi_frame=3"


def test_a_network_that_keeps_its_last_epoch_says_so() -> None:
    runs = [_run("nnet-more-train", 1, {"seconds": 9.0},
                 {"nnet.models.more.type": "dnn", "nnet.effective.init": "dnn", "nnet.effective.epochs": "1",
                  "nnet.effective.keep": "last"})]
    header, body = table(system_rows(latest_by_stage(runs), ["more"], ["test"]), ["test"])
    assert dict(zip(header, body[0]))["objective"] == "hybrid, fine-tuned from dnn, last epoch kept"


def test_a_network_on_anothers_encoder_says_so() -> None:
    runs = [_run("nnet-bpe-train", 1, {"seconds": 9.0},
                 {"nnet.models.bpe.type": "cnn", "nnet.models.bpe.objective": "ctc", "nnet.effective.init": "ctc",
                  "nnet.effective.init_layers": "encoder", "nnet.effective.epochs": "4"})]
    header, body = table(system_rows(latest_by_stage(runs), ["bpe"], ["test"]), ["test"])
    assert dict(zip(header, body[0]))["objective"] == "ctc, on ctc's encoder"
