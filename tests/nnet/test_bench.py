"""``asrflow bench nnet``: FLOPs per frame against a hand count, peaks, and the command on a CTC network."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from asrflow.cli import main
from asrflow.nnet.bench import datasheet_peak, flops_per_frame, matmul_peak
from asrflow.nnet.data import FeatureDataset

from ..conftest import make_config
from .helpers import synthetic_split


def test_datasheet_peaks_know_the_gpu_by_name() -> None:
    assert datasheet_peak("NVIDIA H100 80GB HBM3") == 989.4
    assert datasheet_peak("NVIDIA H100 PCIe") == 756.0  # the longer name wins
    assert datasheet_peak("NVIDIA GeForce GTX 1080") is None


def test_flops_per_frame_count_forward_and_backward_matrix_products(tmp_path: Path) -> None:
    labels = synthetic_split(tmp_path, utterances=6, frames=(100, 100))  # equal lengths: no padding
    data = FeatureDataset(tmp_path / "data", tmp_path / "feats", "train", labels)
    dnn = {"type": "dnn", "hidden": 64, "layers": 1, "context": 0, "dropout": 0.0}
    forward = 2 * (40 * 64 + 64 * 4)  # two Linear layers, multiply-adds counted as 2
    backward = forward + 2 * 64 * 4  # weight gradients of both, input gradient of the second only
    assert flops_per_frame(dnn, 40, 4, "hybrid", data, max_frames=300) == pytest.approx(forward + backward)


def test_matmul_peak_is_positive_on_the_cpu() -> None:
    assert matmul_peak(torch.device("cpu"), size=256, repeats=2) > 0


def test_bench_command_trains_each_network_and_writes_rows(tmp_path: Path, capsys) -> None:
    synthetic_split(tmp_path, utterances=24)
    config = make_config(tmp_path, nnet={"models": {
        "tiny_ctc": {"type": "cnn", "objective": "ctc", "units": "char", "channels": [4], "tdnn_dim": 16,
                     "tdnn_dilations": [1], "subsampling": 2}}})
    config_file = tmp_path / "config.yaml"
    config_file.write_text(yaml.safe_dump(config))
    out = tmp_path / "bench.jsonl"
    argv = ["bench", "nnet", "-c", str(config_file), "--systems", "tiny_ctc", "--data", str(tmp_path / "data"),
            "--features", str(tmp_path / "feats"), "--epochs", "1", "--max-frames", "800,1600", "--out", str(out)]
    assert main(argv) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["max_frames"] for r in rows] == [800, 1600]
    gpu = torch.cuda.is_available()
    for row in rows:
        assert row["device"].startswith("cpu") != gpu and row["frames_per_second"] > 0 and row["gflops_per_frame"] > 0
        assert row["achieved_tflops"] == pytest.approx(row["gflops_per_frame"] * row["frames_per_second"] / 1e3)
        assert row["percent_of_measured_peak"] > 0
        if not gpu:
            assert row["percent_of_datasheet_peak"] is None  # no datasheet figure for a CPU
    assert "| tiny_ctc | " in capsys.readouterr().out
    assert main(argv[:5] + ["nope"] + argv[6:]) == 2  # an unknown network is a usage error naming it
    assert "unknown network(s) nope" in capsys.readouterr().err


def test_the_bare_benchmark_sets_the_trainer_against_a_bare_loop(tmp_path: Path, capsys,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """bench nnet --bare on synthetic data: a row per preset with every key the GPU runs report, and the
    LSTM FLOPs torch's counter leaves out counted by hand; --data-only measures the loader alone."""
    from asrflow.config.sizes import PRESETS
    from asrflow.nnet.bench import recurrent_flops_per_frame
    from asrflow.nnet.models import build_model

    monkeypatch.setitem(PRESETS, "tiny_dnn", {"type": "dnn", "hidden": 32, "layers": 1, "context": 1})
    monkeypatch.setitem(PRESETS, "tiny_ctc", {"type": "conformer", "dim": 16, "layers": 1, "heads": 2, "ffn_dim": 32,
                                              "kernel": 3, "channels": [4, 4], "subsampling": 4})
    out = tmp_path / "bare.jsonl"
    assert main(["bench", "nnet", "--bare", "--presets", "tiny_dnn,tiny_ctc", "--frames", "6000", "--max-frames",
                 "1500", "--workers", "0", "--epochs", "2", "--out", str(out)]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["preset"] for r in rows] == ["tiny_dnn", "tiny_ctc"] and rows[1]["objective"] == "ctc"
    for row in rows:
        for key in ("trainer_fps", "bare_fps", "bare_epoch_fps", "data_fps", "mfu", "bare_mfu"):
            assert row[key] > 0, key
        assert 0 <= row["data_wait"] < 1 and 0 <= row["padding"] < 0.5 and row["device"].startswith("cpu")
    assert "| tiny_dnn |" in capsys.readouterr().out
    lstm = build_model({"type": "lstm", "hidden": 8, "layers": 2, "bidirectional": True, "projection": 0}, 5, 3)
    per_layer = [2 * 4 * 8 * (5 + 8), 2 * 4 * 8 * (16 + 8)]  # input 5, then both directions' 8 outputs
    assert recurrent_flops_per_frame(lstm) == 3 * 2 * sum(per_layer)
    data = tmp_path / "data.jsonl"
    assert main(["bench", "nnet", "--bare", "--data-only", "--frames", "5000", "--max-frames", "1500",
                 "--workers", "1", "--out", str(data)]) == 0
    lines = [json.loads(line) for line in data.read_text().splitlines()]
    assert [r["specaugment"] for r in lines] == [False, True] and all(r["data_fps"] > 0 for r in lines)
