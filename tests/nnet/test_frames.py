"""Frame skipping and multi-frame outputs: networks that compute every k-th frame."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from asrflow.nnet.frames import decimation_layer, frame_skipping, full_rate, multi_frame_init
from asrflow.nnet.models import build_model, frame_context

DNN = {"type": "dnn", "hidden": 16, "layers": 2, "context": 2, "dropout": 0.0}
TDNN = {"type": "cnn", "channels": [], "tdnn_dim": 12, "tdnn_dilations": [1, 1, 2, 3, 3, 3], "norm": "layer",
        "dropout": 0.0}
CNN = {"type": "cnn", "channels": [4], "tdnn_dim": 12, "tdnn_dilations": [1, 2, 3], "norm": "layer", "dropout": 0.0}


def _pair(config: dict, every: int) -> tuple[torch.nn.Module, torch.nn.Module]:
    torch.manual_seed(0)
    whole = build_model(config, 10, 7).eval()
    skipping = build_model(config, 10, 7).eval()
    skipping.load_state_dict(whole.state_dict())
    return whole, frame_skipping(skipping, every)


def test_the_decimation_layer_is_the_lowest_from_which_every_dilation_divides() -> None:
    assert decimation_layer((1, 1, 2, 3, 3, 3), 3) == 3
    assert decimation_layer((1, 1, 2, 3, 3, 3), 2) == 6  # the top dilation is odd: only the output layer
    assert decimation_layer((2, 4, 2), 2) == 0
    assert decimation_layer((1, 2), 1) == 0


@pytest.mark.parametrize(("config", "every"), [(DNN, 2), (DNN, 3), (TDNN, 3), (TDNN, 2), (CNN, 3)])
def test_frame_skipping_copies_the_anchor_frames_scores(config: dict, every: int) -> None:
    """Every k-th frame's scores are those of the network run on every frame (a TDNN's away from the last
    frames, whose padding the anchors see at another distance); the frames between copy them."""
    whole, skipping = _pair(config, every)
    frames = 80
    x = torch.randn(1, frames, 10)
    lengths = torch.tensor([frames])
    with torch.no_grad():
        full, _ = whole(x, lengths)
        skipped, out_lengths = skipping(x, lengths)
    assert skipped.shape == full.shape and torch.equal(out_lengths, lengths)
    interior = frames - 2 * sum(config.get("tdnn_dilations", [])) - every
    anchors = torch.arange(0, interior, every)
    torch.testing.assert_close(skipped[0, anchors], full[0, anchors], rtol=1e-5, atol=1e-5)
    for t in range(frames):
        assert torch.equal(skipped[0, t], skipped[0, t - t % every])


@pytest.mark.parametrize("config", [DNN, TDNN, CNN, {**TDNN, "multi_frame": 3}, {**DNN, "multi_frame": 2}])
def test_an_utterance_scores_the_same_alone_and_in_a_padded_batch(config: dict) -> None:
    torch.manual_seed(0)
    model = build_model(config, 10, 7).eval()
    if model.heads == 1:
        frame_skipping(model, 3)
    long, short = torch.randn(31, 10), torch.randn(17, 10)
    batch = torch.stack([long, torch.cat([short, short[-1:].expand(14, -1)])])
    with torch.no_grad():
        together, _ = model(batch, torch.tensor([31, 17]))
        alone, _ = model(short.unsqueeze(0), torch.tensor([17]))
    torch.testing.assert_close(together[1, :17], alone[0], rtol=1e-5, atol=1e-5)


def test_multi_frame_heads_fill_the_frames_after_their_anchor() -> None:
    logits = torch.arange(2 * 3 * 6, dtype=torch.float32).reshape(2, 3, 6)  # 3 anchors, 2 heads of 3 classes
    out = full_rate(logits, every=2, heads=2, start=0, frames=5)
    assert out.shape == (2, 5, 3)
    torch.testing.assert_close(out[:, 2], logits[:, 1, :3])
    torch.testing.assert_close(out[:, 3], logits[:, 1, 3:])
    shifted = full_rate(logits, every=2, heads=2, start=-1, frames=5)  # phase 1: the first anchor stands for frame -1
    torch.testing.assert_close(shifted[:, 0], logits[:, 0, 3:])
    copied = full_rate(logits[..., :3], every=2, heads=1, start=0, frames=5)
    torch.testing.assert_close(copied[:, 3], logits[:, 1, :3])


@pytest.mark.parametrize("config", [DNN, TDNN])
def test_a_multi_frame_network_from_one_head_scores_as_frame_skipping(config: dict) -> None:
    """Heads started from a one-head network's output layer (init) give that network's frame-skipping scores."""
    whole, skipping = _pair(config, 3)
    multi = build_model({**config, "multi_frame": 3}, 10, 7).eval()
    multi.load_state_dict(multi_frame_init(whole.state_dict(), 3))
    x = torch.randn(2, 25, 10)
    lengths = torch.tensor([25, 25])
    with torch.no_grad():
        torch.testing.assert_close(multi(x, lengths)[0], skipping(x, lengths)[0])
    assert frame_context(multi) is None and frame_context(whole) is not None


@pytest.mark.parametrize("config", [DNN, TDNN])
def test_a_multi_frame_network_learns_every_frame(config: dict) -> None:
    """Each head learns its own frame: labels that change every frame are learnt by a network run every 3rd."""
    torch.manual_seed(0)
    width = {"hidden": 32} if config["type"] == "dnn" else {"tdnn_dim": 32}
    model = build_model({**config, **width, "multi_frame": 3}, 4, 2)
    x = torch.randn(8, 30, 4)
    y = (x[..., 0] > 0).long()
    lengths = torch.full((8,), 30)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(120):
        logits, _ = model(x, lengths)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 2), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        accuracy = (model(x, lengths)[0].argmax(-1) == y).float().mean()
    assert accuracy > 0.9


def test_frame_skipping_needs_a_one_head_feed_forward_network() -> None:
    with pytest.raises(ValueError, match="LSTM computes every frame"):
        frame_skipping(build_model({"type": "lstm", "hidden": 8, "layers": 1}, 10, 7), 2)
    with pytest.raises(ValueError, match="multi-frame outputs"):
        frame_skipping(build_model({**DNN, "multi_frame": 2}, 10, 7), 2)


def test_config_checks_frame_skipping_multi_frame_and_decoding_variants() -> None:
    from asrflow.config import ConfigError, resolve_config
    from asrflow.config.settings import decoding

    def config(models: dict, decode: dict | None = None) -> dict:
        return resolve_config({"experiment": "x", "corpus": {"name": "yesno"}, "evaluation": {"systems": list(models)},
                               "nnet": {"models": models, "decode": decode or {}}})

    resolved = config({"dnn": dict(DNN), "mf": {**DNN, "init": "dnn", "multi_frame": 3},
                       "skip": {**DNN, "init": "dnn", "train": {"epochs": 0}, "decode": {"frame_skip": 2}}})
    assert decoding(resolved, "skip").frame_skip == 2 and decoding(resolved, "dnn").frame_skip == 1
    assert decoding(resolved).batch_frames == 2000 and decoding(resolved).device == "cpu"
    assert decoding(config({"dnn": {**DNN, "decode": {"device": "auto"}}}), "dnn").device == "auto"
    with pytest.raises(ConfigError, match="device"):
        config({"dnn": dict(DNN)}, decode={"device": "gpu"})
    with pytest.raises(ConfigError, match="multi_frame"):
        config({"blstm": {"type": "lstm", "multi_frame": 2}})
    with pytest.raises(ConfigError, match="0 epochs needs init"):
        config({"dnn": {**DNN, "train": {"epochs": 0}}})
    with pytest.raises(ConfigError, match="needs dnn or cnn"):
        config({"lstm": {"type": "lstm"}, "dnn": dict(DNN), "both": {"type": "ensemble", "members": ["lstm", "dnn"]}},
               decode={"frame_skip": 2})
    with pytest.raises(ConfigError, match="multi-frame network"):
        config({"mf": {**DNN, "multi_frame": 2, "decode": {"frame_skip": 2}}})
    with pytest.raises(ConfigError, match="differ"):
        config({"mf": {**DNN, "multi_frame": 2}, "mf3": {**DNN, "init": "mf", "multi_frame": 3}})


def test_decoding_loads_a_network_with_frame_skipping(tmp_path) -> None:
    """``nnet.decode.frame_skip`` reaches the decoding workers' network (cached apart from the one without)."""
    from asrflow.nnet.inference import Scoring

    whole, skipping = _pair(TDNN, 3)
    torch.save({"model": whole.state_dict(), "config": TDNN, "input_dim": 10, "num_classes": 7},
               tmp_path / "final.pt")
    feats = [torch.randn(50, 10).numpy(), torch.randn(23, 10).numpy()]
    skipped = Scoring(str(tmp_path / "final.pt"), frame_skip=3, batch_frames=60).log_posteriors(feats)
    every = Scoring(str(tmp_path / "final.pt")).log_posteriors(feats)
    for x, got, full in zip(feats, skipped, every):
        with torch.no_grad():
            want = torch.log_softmax(skipping(torch.from_numpy(x)[None], torch.tensor([len(x)]))[0][0], -1)
        torch.testing.assert_close(torch.from_numpy(got), want, rtol=1e-4, atol=1e-4)
        assert got.shape == full.shape and not torch.allclose(torch.from_numpy(got), torch.from_numpy(full))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without a GPU")
def test_decoding_on_a_device_torch_cannot_see_is_a_clear_error(tmp_path) -> None:
    """``nnet.decode.device: cuda`` without a GPU names the key; ``auto`` falls back to the CPU."""
    from asrflow.nnet import NnetError
    from asrflow.nnet.inference import Scoring, scoring_device

    torch.save({"model": build_model(DNN, 10, 7).state_dict(), "config": DNN, "input_dim": 10, "num_classes": 7},
               tmp_path / "final.pt")
    with pytest.raises(NnetError, match="nnet.decode.device is cuda"):
        Scoring(str(tmp_path / "final.pt"), device="cuda").load()
    assert scoring_device("auto") == torch.device("cpu")
    feats = [torch.randn(9, 10).numpy()]
    auto = Scoring(str(tmp_path / "final.pt"), device="auto").log_posteriors(feats)
    cpu = Scoring(str(tmp_path / "final.pt")).log_posteriors(feats)
    assert np.array_equal(auto[0], cpu[0])


def test_a_decoding_variant_trains_no_epoch_and_keeps_its_init_weights(tmp_path) -> None:
    """``train.epochs`` 0 with ``init``: final.pt is the init network as it is (a variant decoded differently)."""
    from asrflow.config.settings import Training
    from asrflow.nnet.data import FeatureDataset
    from asrflow.nnet.train import train

    from .helpers import synthetic_split

    labels = synthetic_split(tmp_path, utterances=12)
    data = FeatureDataset(tmp_path / "data", tmp_path / "feats", "train", labels)
    config = {"type": "dnn", "hidden": 16, "layers": 1, "context": 1, "dropout": 0.0}
    opts = Training.defaults(epochs=1, max_frames=500, lr=1e-2, warmup_steps=2, patience=5, seed=1)
    train(config, opts, data, data, 4, tmp_path / "trained", log=lambda line: None)
    trained = torch.load(tmp_path / "trained" / "final.pt", weights_only=True)
    summary = train(config, Training.defaults(**{**vars(opts), "epochs": 0}), data, data, 4, tmp_path / "variant",
                    log=lambda line: None, init=trained)
    variant = torch.load(tmp_path / "variant" / "final.pt", weights_only=True)
    assert summary["steps"] == 0 and all(torch.equal(variant["model"][k], v) for k, v in trained["model"].items())


def test_a_decoding_variant_of_a_compressed_network_keeps_its_layers(tmp_path) -> None:
    """A variant (train.epochs 0) may start from a factorised network and takes its ranks; a network trained on
    from one may not."""
    from asrflow.config import ConfigError, resolve_config
    from asrflow.nnet.lowrank import factorised_init
    from asrflow.nnet.stage import initial_weights

    def config(models: dict) -> dict:
        return resolve_config({"experiment": "x", "corpus": {"name": "yesno"}, "evaluation": {"systems": list(models)},
                               "nnet": {"models": models}})

    svd = {**DNN, "init": "dnn", "low_rank": {"keep": 0.3}}
    resolved = config({"dnn": DNN, "svd": svd, "fast": {**DNN, "init": "svd", "train": {"epochs": 0},
                                                        "decode": {"frame_skip": 2}}})
    with pytest.raises(ConfigError, match="decoding variant"):
        config({"dnn": DNN, "svd": svd, "again": {**DNN, "init": "svd"}})
    whole = build_model(DNN, 10, 7)
    saved = {"model": whole.state_dict(), "config": DNN, "input_dim": 10, "num_classes": 7, "objective": "hybrid"}
    init, ranks = factorised_init(saved, whole, {"keep": 0.3})
    torch.save({**init, "config": {**DNN, "ranks": ranks}}, tmp_path / "final.pt")
    assert initial_weights(resolved, "fast", tmp_path)["config"]["ranks"] == ranks
