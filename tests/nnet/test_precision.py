"""Decoding precision: a TDNN's convolutions as linear layers over spliced frames, int8 and bfloat16 scoring."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

from asrflow.nnet import NnetError
from asrflow.nnet.frames import frame_skipping
from asrflow.nnet.inference import Scoring, batch_log_posteriors
from asrflow.nnet.models import build_model
from asrflow.nnet.precision import SplicedLinear, int8_network, spliced, with_precision

TDNN = {"type": "cnn", "channels": [], "tdnn_dim": 32, "tdnn_dilations": [1, 1, 2, 3], "norm": "batch",
        "dropout": 0.0}
CNN = {"type": "cnn", "channels": [4], "tdnn_dim": 24, "tdnn_dilations": [1, 2], "norm": "layer", "dropout": 0.0}
DNN = {"type": "dnn", "hidden": 32, "layers": 2, "context": 2, "dropout": 0.0}
BLSTM = {"type": "lstm", "hidden": 24, "layers": 2, "bidirectional": True, "projection": 0}


def _logits(model: nn.Module, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(x, lengths)[0]


@pytest.mark.parametrize("kernel,dilation", [(3, 1), (3, 2), (3, 3), (5, 2), (1, 1)])
def test_a_spliced_linear_layer_is_the_convolution(kernel: int, dilation: int) -> None:
    torch.manual_seed(kernel * 10 + dilation)
    reach = dilation * (kernel // 2)
    conv = nn.Conv1d(6, 5, kernel, dilation=dilation, padding=reach, padding_mode="replicate" if reach else "zeros")
    x = torch.randn(3, 6, 17)
    with torch.no_grad():
        torch.testing.assert_close(SplicedLinear(conv)(x), conv(x), rtol=1e-5, atol=1e-5)


def test_only_frame_spliced_convolutions_are_converted() -> None:
    zero_padded = nn.Conv1d(4, 4, 3, padding=1)  # zeros at the edges: not a repeat of the edge frames
    strided = nn.Conv1d(4, 4, 3, stride=2, padding=1, padding_mode="replicate")
    model = nn.Sequential(zero_padded, strided, nn.Conv1d(4, 4, 3, padding=1, padding_mode="replicate"))
    spliced(model)
    assert [type(m) for m in model] == [nn.Conv1d, nn.Conv1d, SplicedLinear]
    with pytest.raises(ValueError, match="not a frame-spliced convolution"):
        SplicedLinear(zero_padded)


@pytest.mark.parametrize("config", [TDNN, CNN], ids=["tdnn", "cnn"])
@pytest.mark.parametrize("every", [1, 3])
def test_a_spliced_network_scores_as_the_convolutional_one(config: dict, every: int) -> None:
    """Made linear after frame skipping is set, with padded batches of different lengths."""
    torch.manual_seed(0)
    model = build_model(config, 10, 7).eval()
    model = frame_skipping(model, every) if every > 1 else model
    x, lengths = torch.randn(2, 31, 10), torch.tensor([31, 12])
    converted = spliced(copy.deepcopy(model))
    assert not any(type(m) is nn.Conv1d for m in converted.tdnn.modules())
    torch.testing.assert_close(_logits(converted, x, lengths), _logits(model, x, lengths), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("config", [TDNN, CNN, DNN, BLSTM], ids=["tdnn", "cnn", "dnn", "blstm"])
def test_an_int8_network_quantises_its_layers_and_scores_close_to_float(config: dict) -> None:
    torch.manual_seed(1)
    model = build_model(config, 10, 7).eval()
    x, lengths = torch.randn(3, 40, 10), torch.tensor([40, 33, 9])
    want = _logits(model, x, lengths)
    quantised = int8_network(copy.deepcopy(model))
    kinds = {type(m).__module__ for m in quantised.modules()}
    assert "torch.ao.nn.quantized.dynamic.modules.linear" in kinds
    assert not any(type(m) in (nn.Linear, nn.LSTM) for m in quantised.modules())
    got = _logits(quantised, x, lengths)
    assert got.shape == want.shape
    valid = torch.arange(40)[None, :] < lengths[:, None]
    error = (got - want)[valid].norm() / want[valid].norm()
    assert error < 0.05, f"relative error of int8 logits {error:.3f}"


def test_a_low_rank_tdnns_thin_convolutions_are_converted_too() -> None:
    from asrflow.nnet.lowrank import LowRank

    torch.manual_seed(2)
    model = build_model(TDNN, 10, 7).eval()
    for block in model.tdnn:
        block[0] = LowRank(block[0], 4)
    x, lengths = torch.randn(2, 20, 10), torch.tensor([20, 14])
    converted = spliced(copy.deepcopy(model))
    assert not any(type(m) is nn.Conv1d for m in converted.modules())
    torch.testing.assert_close(_logits(converted, x, lengths), _logits(model, x, lengths), rtol=1e-4, atol=1e-4)


def test_decoding_scores_in_the_configured_precision(tmp_path) -> None:
    """``nnet.decode.precision`` reaches the decoding workers' network, cached apart from the float one."""
    torch.manual_seed(3)
    model = build_model(TDNN, 10, 7).eval()
    torch.save({"model": model.state_dict(), "config": TDNN, "input_dim": 10, "num_classes": 7},
               tmp_path / "final.pt")
    feats = [np.random.default_rng(0).standard_normal((n, 10)).astype(np.float32) for n in (50, 23)]
    path = str(tmp_path / "final.pt")
    floats = Scoring(path).log_posteriors(feats)
    int8 = Scoring(path, precision="int8")
    assert any("quantized" in type(m).__module__ for m in int8.load()[0].modules())
    assert not any("quantized" in type(m).__module__ for m in Scoring(path).load()[0].modules())
    for precision, tolerance in (("int8", 0.1), ("bfloat16", 0.1)):
        got = Scoring(path, precision=precision).log_posteriors(feats)
        for a, b in zip(got, floats):
            assert a.shape == b.shape and a.dtype == np.float32
            assert np.abs(a - b).max() < tolerance, precision
            assert np.mean(a.argmax(1) == b.argmax(1)) > 0.9


def test_int8_is_for_the_cpu_and_an_unknown_precision_is_named() -> None:
    model = build_model(DNN, 10, 7).eval()
    with pytest.raises(NnetError, match="int8 runs on the CPU"):
        with_precision(model, "int8", torch.device("cuda"))
    with pytest.raises(ValueError, match="nnet.decode.precision must be one of"):
        with_precision(model, "float16", torch.device("cpu"))
    feats = [np.zeros((5, 10), np.float32)]
    assert batch_log_posteriors(model, feats, 100, "bfloat16")[0].dtype == np.float32
