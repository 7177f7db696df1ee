import inspect
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from asrflow.config.sizes import PRESETS, SIZES
from asrflow.nnet.models import MODELS, build_model, parameter_count, splice

CONFIGS = [
    {"type": "dnn", "hidden": 64, "layers": 2, "context": 3},
    {"type": "lstm", "hidden": 32, "layers": 2, "bidirectional": True, "projection": 16},
    {"type": "lstm", "hidden": 32, "layers": 1, "bidirectional": False},
    {"type": "cnn", "channels": [8, 8], "tdnn_dim": 32, "tdnn_dilations": [1, 2]},
    {"type": "cnn", "channels": [8], "tdnn_dim": 32, "tdnn_dilations": [1], "subsampling": 3},
    {"type": "cnn", "channels": [], "tdnn_dim": 32, "tdnn_dilations": [1, 3]},  # a plain TDNN
    {"type": "cnn", "channels": [], "tdnn_dim": 32, "tdnn_dilations": [1, 3, 3], "subsampling": 3},  # chain TDNN
    {"type": "cnn", "channels": [8, 8], "tdnn_dim": 32, "tdnn_dilations": [1, 2], "norm": "layer"},
    {"type": "conformer", "dim": 32, "layers": 2, "heads": 4, "ffn_dim": 64, "kernel": 5, "channels": [8]},
    {"type": "conformer", "dim": 32, "layers": 1, "heads": 2, "ffn_dim": 48, "kernel": 3, "channels": [8, 8],
     "subsampling": 4},
]


def test_splice_repeats_edges() -> None:
    x = torch.arange(4.0).reshape(1, 4, 1)
    y = splice(x, 1)
    assert y.shape == (1, 4, 3)
    assert y[0].tolist() == [[0, 0, 1], [0, 1, 2], [1, 2, 3], [2, 3, 3]]


def test_splice_matches_frame_by_frame_stacking_and_its_gradient() -> None:
    """Against stacking each frame's neighbours one by one, each sequence clamped to its own length; the
    gradient of a frame is the sum over every window it appears in."""
    torch.manual_seed(0)
    x = torch.randn(3, 9, 4, requires_grad=True)
    lengths, context = torch.tensor([9, 5, 1]), 3
    y = splice(x, context, lengths)
    expected = torch.stack([torch.stack([torch.cat([x[b, min(max(t + o, 0), int(lengths[b]) - 1)]
                                                    for o in range(-context, context + 1)]) for t in range(9)])
                            for b in range(3)])
    assert torch.equal(y, expected)
    weights = torch.randn_like(y)
    (got,) = torch.autograd.grad((y * weights).sum(), x)
    (want,) = torch.autograd.grad((expected * weights).sum(), x)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c["type"] + str(len(c)))
def test_shapes_lengths_and_padding_independence(config: dict) -> None:
    torch.manual_seed(0)
    model = build_model(config, input_dim=40, output_dim=11).eval()
    assert parameter_count(model) > 0
    x = torch.randn(2, 30, 40)
    x[1, 18:] = x[1, 17]  # collate pads by repeating the last frame
    lengths = torch.tensor([30, 18])
    logits, out_lengths = model(x, lengths)
    sub = config.get("subsampling", 1)
    assert logits.shape == (2, (30 + sub - 1) // sub, 11)
    assert out_lengths.tolist() == [(30 + sub - 1) // sub, (18 + sub - 1) // sub]
    if config["type"] in ("dnn", "lstm", "conformer") or sub == 1 or not config["channels"]:
        # the second utterance alone gives the same outputs as inside the padded batch
        alone, _ = model(x[1:, :18], lengths[1:])
        torch.testing.assert_close(logits[1, :out_lengths[1]], alone[0], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("kind", ["cnn", "conformer"])
def test_layer_norm_computes_the_same_in_training_and_inference(kind: str) -> None:
    """With ``norm: layer`` (and no dropout) a batch in training mode gives the outputs of inference, and an
    utterance's training-mode outputs do not depend on the batch around it; with ``norm: batch`` they do."""
    sizes = ({"channels": [8, 8], "tdnn_dim": 32, "tdnn_dilations": [1, 2]} if kind == "cnn"
             else {"dim": 32, "layers": 1, "heads": 4, "ffn_dim": 64, "kernel": 5, "channels": [8]})
    torch.manual_seed(0)
    scale, shift = torch.tensor([1.0, 3.0, 0.2]).view(3, 1, 1), torch.tensor([0.0, 2.0, -1.0]).view(3, 1, 1)
    x = torch.randn(3, 30, 40) * scale + shift  # utterances unlike each other
    lengths = torch.tensor([30, 30, 30])
    outputs = {}
    for norm in ("batch", "layer"):
        model = build_model({"type": kind, **sizes, "norm": norm, "dropout": 0.0}, 40, 11)
        trained, _ = model.train()(x, lengths)
        alone, _ = model(x[:1], lengths[:1])
        inferred, _ = model.eval()(x, lengths)
        outputs[norm] = (trained, alone, inferred)
    trained, alone, inferred = outputs["layer"]
    torch.testing.assert_close(trained, inferred, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(trained[:1], alone, atol=1e-5, rtol=1e-4)
    trained, alone, inferred = outputs["batch"]
    assert not torch.allclose(trained, inferred, atol=1e-3)
    assert not torch.allclose(trained[:1], alone, atol=1e-3)
    with pytest.raises(ValueError, match="unknown norm 'group'; known: batch, layer"):
        build_model({"type": kind, **sizes, "norm": "group"}, 40, 11)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_are_of_realistic_size(name: str) -> None:
    """Each preset builds, and to the size its documentation gives (40-dim input; 3,000 pdfs, CTC 500 units)."""
    expected = {"dnn_6x2048": 28.06, "cnn_tdnn_20m": 19.68, "blstm_3x512": 17.94, "conformer_20m": 18.88}
    outputs = 500 if name.startswith("conformer") else 3000
    model = build_model({"preset": name}, 40, outputs)
    assert parameter_count(model) / 1e6 == pytest.approx(expected[name], abs=0.01)


def test_a_preset_is_one_key_and_its_sizes_can_be_overridden() -> None:
    from asrflow.config import ConfigError, resolve_config

    base = {"experiment": "x", "corpus": {"name": "yesno"}}
    config = resolve_config({**base, "nnet": {"models": {"big": {"preset": "dnn_6x2048", "hidden": 1024}}},
                             "evaluation": {"systems": ["big"]}})
    big = config["nnet"]["models"]["big"]
    assert (big["type"], big["layers"], big["hidden"], big["context"]) == ("dnn", 6, 1024, 5)
    with pytest.raises(ConfigError, match="unknown preset 'huge'; known: dnn_6x2048"):
        resolve_config({**base, "nnet": {"models": {"big": {"preset": "huge"}}}})
    with pytest.raises(ConfigError, match="preset blstm_3x512 is a lstm model, but type is dnn"):
        resolve_config({**base, "nnet": {"models": {"big": {"preset": "blstm_3x512", "type": "dnn"}}}})
    with pytest.raises(ConfigError, match="subsampling 4 needs alignments: chain"):
        resolve_config({**base, "nnet": {"models": {"c": {"preset": "conformer_20m"}}},
                        "evaluation": {"systems": ["c"]}})


def test_model_trains_on_a_toy_task() -> None:
    torch.manual_seed(0)
    model = build_model({"type": "dnn", "hidden": 32, "layers": 1, "context": 1, "dropout": 0.0}, 4, 2)
    x = torch.randn(8, 20, 4)
    y = (x[..., 0] > 0).long()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(100):
        logits, _ = model(x, torch.full((8,), 20))
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 2), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.2


def test_sizes_table_names_each_model_class_keyword() -> None:
    """SIZES (read by config resolution without torch) lists exactly each class's size arguments."""
    for kind, model in MODELS.items():
        params = inspect.signature(model.__init__).parameters
        assert set(params) - {"self", "input_dim", "output_dim"} == set(SIZES[kind]), kind
    built = build_model({"type": "dnn", "hidden": 8}, 3, 2)  # the rest from SIZES
    assert built.context == SIZES["dnn"]["context"] and len(built.body) == 4 * SIZES["dnn"]["layers"]


def test_resolving_a_config_does_not_import_torch() -> None:
    code = ("import sys; from asrflow.config import load_config; "
            "c = load_config('config/config.yaml'); "
            "assert c['nnet']['models']['dnn']['dropout'] is not None; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).resolve().parents[2])


def test_a_plain_tdnn_subsamples_by_running_its_upper_layers_every_k_th_frame() -> None:
    """Without convolutions to stride, a plain TDNN subsamples as Kaldi's chain TDNNs do: the layers from the
    lowest whose dilations are multiples of k run on frames 0, k, 2k, … only, and give there exactly what the
    same weights give at the full frame rate, away from the utterance's end."""
    torch.manual_seed(0)
    sizes = {"type": "cnn", "channels": [], "tdnn_dim": 16, "tdnn_dilations": [1, 1, 3, 3], "dropout": 0.0}
    full = build_model(sizes, 12, 7).eval()
    sub = build_model({**sizes, "subsampling": 3}, 12, 7).eval()
    sub.load_state_dict(full.state_dict())
    x = torch.randn(2, 40, 12)
    x[1, 29:] = x[1, 28]
    lengths = torch.tensor([40, 29])
    every, _ = full(x, lengths)
    some, out_lengths = sub(x, lengths)
    assert some.shape == (2, 14, 7) and out_lengths.tolist() == [14, 10]
    # a frame sees 8 frames either side: frames up to 31 of the first utterance, up to 20 of the second
    torch.testing.assert_close(some[0, :11], every[0, 0:31:3], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(some[1, :7], every[1, 0:19:3], atol=1e-5, rtol=1e-4)
    assert sub.train()(x, lengths)[0].shape == (2, 14, 7)  # no random phase in training: targets sit at 0, k, …
    with pytest.raises(ValueError, match="multi_frame must be 1"):
        build_model({**sizes, "subsampling": 3, "multi_frame": 3}, 12, 7)


def test_unknown_type_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown model type 'rnn'"):
        build_model({"type": "rnn"}, 40, 10)


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c["type"] + str(len(c)))
def test_batched_inference_matches_one_by_one(config: dict) -> None:
    import numpy as np

    from asrflow.nnet.inference import batch_log_posteriors, log_posteriors

    torch.manual_seed(1)
    model = build_model(config, input_dim=12, output_dim=7).eval()
    rng = np.random.default_rng(0)
    feats = [rng.standard_normal((n, 12)).astype(np.float32) for n in (23, 9, 40, 17)]
    batched = batch_log_posteriors(model, feats, max_frames=60)
    for x, y in zip(feats, batched):
        np.testing.assert_allclose(y, log_posteriors(model, x), atol=1e-4)


@pytest.mark.parametrize("config", [c for c in CONFIGS if c["type"] in ("dnn", "cnn")], ids=lambda c: str(len(c)))
def test_frame_context_is_the_window_an_output_frame_sees(config: dict) -> None:
    """A frame computed inside a window of exactly frame_context frames either side equals the frame computed on
    the whole utterance; one frame less of context changes it (so the context is not overstated either)."""
    from asrflow.nnet.models import frame_context

    torch.manual_seed(0)
    model = build_model(config, input_dim=40, output_dim=11).eval()
    c = frame_context(model)
    if config.get("subsampling", 1) != 1:
        assert c is None
        return
    assert c == (config["context"] if config["type"] == "dnn"
                 else len(config["channels"]) + sum(config["tdnn_dilations"]))
    x = torch.randn(1, 40, 40)
    whole, _ = model(x, torch.tensor([40]))
    t = 20
    window, _ = model(x[:, t - c:t + c + 1], torch.tensor([2 * c + 1]))
    torch.testing.assert_close(window[0, c], whole[0, t], atol=1e-5, rtol=1e-4)
    narrower, _ = model(x[:, t - c + 1:t + c], torch.tensor([2 * c - 1]))
    assert not torch.allclose(narrower[0, c - 1], whole[0, t], atol=1e-4)
    assert frame_context(build_model(CONFIGS[1], input_dim=40, output_dim=11)) is None
