"""The MLflow model's bundle: a lone wav file is normalised as the network's training data was."""

from __future__ import annotations

import json
from pathlib import Path

import kaldiio
import numpy as np

from ..conftest import make_config


def _cmvn_scp(folder) -> None:
    """Two speakers' CMVN statistics of 3-dimensional features, as the features stage writes them."""
    stats = {"a": np.array([[2.0, 4.0, 6.0, 2.0], [5.0, 9.0, 20.0, 0.0]]),
             "b": np.array([[3.0, 3.0, 3.0, 3.0], [3.0, 3.0, 3.0, 0.0]])}
    (folder / "train").mkdir(parents=True)
    with kaldiio.WriteHelper(f"ark,scp:{folder}/train/cmvn.ark,{folder}/train/cmvn.scp") as writer:
        for spk, mat in stats.items():
            writer(spk, mat)


def test_bundle_carries_pooled_statistics_only_for_per_speaker_cmvn(tmp_path) -> None:
    from asrflow.config.paths import Paths
    from asrflow.nnet.transcribe import bundle_files

    _cmvn_scp(tmp_path / "fbank")
    config = make_config(tmp_path, features={"kinds": ["fbank"]},
                         nnet={"models": {"spk": {"type": "dnn"}, "utt": {"type": "dnn", "cmvn": "utterance"}}},
                         evaluation={"systems": ["spk", "utt"]})
    for system in ("spk", "utt"):
        (tmp_path / system).mkdir()
    def paths(system: str) -> Paths:
        return Paths(data=tmp_path, features=tmp_path / "fbank", out=tmp_path / system, model=tmp_path / system,
                     gmm=tmp_path, graph=tmp_path)

    spk = bundle_files(config, "spk", "train", paths("spk"))
    utt = bundle_files(config, "utt", "train", paths("utt"))
    np.testing.assert_allclose(np.load(spk["cmvn"]), [[5.0, 7.0, 9.0, 5.0], [8.0, 12.0, 23.0, 0.0]])
    assert "cmvn" not in utt and not (tmp_path / "utt" / "cmvn.npy").exists()  # each file its own mean
    assert [json.loads(Path(b["settings"]).read_text())["cmvn"] for b in (spk, utt)] == ["speaker", "utterance"]


def test_one_speakers_files_are_normalised_with_their_joint_statistics() -> None:
    """``one_speaker``: the files' own joint mean, as the decode stage normalises a test speaker; otherwise the
    pooled training statistics; a network trained with per-utterance CMVN: each file's own mean either way."""
    from asrflow.features.transforms import cmvn_stats
    from asrflow.nnet.transcribe import Transcriber

    raw = {"a.wav": np.array([[1.0, 2.0], [3.0, 4.0]]), "b.wav": np.array([[5.0, 6.0], [7.0, 8.0], [9.0, 10.0]])}
    transcriber = Transcriber.__new__(Transcriber)  # no network needed to normalise features
    transcriber.raw_features = raw.__getitem__
    transcriber.cmvn = cmvn_stats(np.array([[0.0, 10.0], [2.0, 10.0]]))  # training mean (1, 10)
    joint = transcriber.featurise(list(raw), one_speaker=True)
    np.testing.assert_allclose(joint[0], raw["a.wav"] - [5.0, 6.0])  # the mean of all five frames
    np.testing.assert_allclose(joint[1], raw["b.wav"] - [5.0, 6.0])
    np.testing.assert_allclose(transcriber.featurise(["a.wav"])[0], raw["a.wav"] - [1.0, 10.0])
    transcriber.cmvn = None
    for one_speaker in (False, True):
        own = transcriber.featurise(list(raw), one_speaker=one_speaker)
        np.testing.assert_allclose(own[1], raw["b.wav"] - [7.0, 8.0])


def test_the_bundle_scores_with_the_networks_own_decode_settings(tmp_path) -> None:
    """A network's own ``decode`` overrides (frame skipping, int8) are saved and the transcriber scores with them."""
    import torch

    from asrflow.config.paths import Paths
    from asrflow.nnet.models import build_model
    from asrflow.nnet.transcribe import Transcriber, bundle_files

    _cmvn_scp(tmp_path / "fbank")
    tdnn = {"type": "cnn", "channels": [], "tdnn_dim": 16, "tdnn_dilations": [1, 3]}
    config = make_config(tmp_path, features={"kinds": ["fbank"]},
                         nnet={"models": {"tdnn": {**tdnn, "decode": {"precision": "int8", "frame_skip": 3}}}},
                         evaluation={"systems": ["tdnn"]})
    (tmp_path / "tdnn").mkdir()
    torch.save({"model": build_model(tdnn, 3, 4).state_dict(), "config": tdnn, "input_dim": 3, "num_classes": 4},
               tmp_path / "tdnn" / "final.pt")
    files = bundle_files(config, "tdnn", "train", Paths(data=tmp_path, features=tmp_path / "fbank",
                                                        out=tmp_path / "tdnn", model=tmp_path / "tdnn",
                                                        gmm=tmp_path, graph=tmp_path))
    settings = json.loads(Path(files["settings"]).read_text())
    assert settings["decode"]["precision"] == "int8" and settings["decode"]["frame_skip"] == 3
    settings["decoder"] = "tlg"  # a graph search that needs no GMM here; the scoring is what is checked
    Path(files["settings"]).write_text(json.dumps(settings))
    for name in ("TLG.fst", "words.txt"):
        (tmp_path / name).write_text("")
    transcriber = Transcriber({**files, "graph": str(tmp_path / "TLG.fst"), "words": str(tmp_path / "words.txt")})
    assert transcriber.network.every == 3
    assert any("quantized" in type(m).__module__ for m in transcriber.network.modules())
    transcriber.close()
