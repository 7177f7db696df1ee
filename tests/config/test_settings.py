"""The typed settings: their fields are the schema's keys, and they are built from a resolved config."""

from __future__ import annotations

import dataclasses

import pytest

from asrflow.config import ConfigError
from asrflow.config import settings as s
from asrflow.config.settings import Decoding, Mmi, Parallel, SpecAugment, Training, Tuning, schema_defaults
from asrflow.parallel import ParallelError
from tests.conftest import make_config

CLASSES = (SpecAugment, Mmi, Training, Parallel, Tuning, Decoding)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_fields_are_the_schema_keys(cls) -> None:
    """Every key of the class's schema section is a field, and every field a key: the schema stays the one
    source of keys and defaults, and a key added there without a field here fails."""
    assert [f.name for f in dataclasses.fields(cls)] == list(schema_defaults(cls.SCHEMA))
    assert all(f.default is dataclasses.MISSING for f in dataclasses.fields(cls))  # no defaults of its own


def test_settings_are_built_from_the_resolved_config(tmp_path) -> None:
    config = make_config(tmp_path, nnet={
        "train": {"lr": 0.01, "specaugment": {"freq_width": 4}},
        "parallel": {"strategy": "ring", "learners": 2},
        "models": {"d": {"type": "dnn", "hidden": 64, "train": {"mmi": {"weight": 2.0}, "seed": 7},
                         "parallel": {"learners": 4}},
                   "d2": {"type": "dnn", "hidden": 64}, "e": {"type": "ensemble", "members": ["d", "d2"]}}},
        evaluation={"systems": ["d", "e"]})
    net = s.network(config, "d")
    assert net.training.lr == 0.01 and net.training.seed == 7 and net.training.mmi.weight == 2.0
    assert net.training.specaugment == SpecAugment(0, 4, 0, 20, 0.0)
    assert net.parallel.strategy == "ring" and net.parallel.learners == 4
    assert net.sizes["hidden"] == 64 and net.features == "fbank" and net.alignments == "tri" and net.trained
    assert s.training(config, "d").replace(epochs=1).epochs == 1
    assert s.training(config, "d2").seed == config["seed"] == 0  # the experiment's seed
    assert s.network(config, "e").training is None and s.network(config, "e").members == ("d", "d2")
    assert s.decoding(config).tune.enabled and s.decoding(config).shard_utts == 100
    own = make_config(tmp_path, nnet={"decode": {"tune": {"insertion_penalty": [0.0, 2.0]}}, "models": {
        "c": {"type": "dnn", "decode": {"acoustic_scale": 1.0, "tune": {"acoustic_scale": [0.8, 1.2]}}}}})
    tuned = s.decoding(own, "c")  # a network's own scale and lists, the rest from nnet.decode.tune key by key
    assert tuned.acoustic_scale == 1.0 and tuned.tune.acoustic_scale == [0.8, 1.2]
    assert tuned.tune.insertion_penalty == [0.0, 2.0] and s.decoding(own).tune.acoustic_scale[0] == 0.03
    bpe = make_config(tmp_path, nnet={"models": {"b": {"type": "cnn", "objective": "ctc", "units": "bpe", "decode": {
        "word_bonus": 2.0, "tune": {"word_bonus": [1.0, 4.0, 6.0], "tlg_acoustic_scale": [1.0]}}}}})
    tuned = s.decoding(bpe, "b")  # a CTC network's own word bonus and lists
    assert tuned.word_bonus == 2.0 and tuned.tune.word_bonus == [1.0, 4.0, 6.0]
    assert tuned.tune.tlg_acoustic_scale == [1.0]
    assert tuned.tune.lm_weight == s.decoding(bpe).tune.lm_weight and s.decoding(bpe).tune.word_bonus[-1] == 3.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        net.training.lr = 1.0  # type: ignore[misc]
    with pytest.raises(ConfigError, match="'nope' is not a network"):
        s.network(config, "nope")


def test_defaults_come_from_the_schema() -> None:
    opts = Training.defaults(epochs=3, mmi={"weight": 1.0})
    assert opts.epochs == 3 and opts.mmi == Mmi(1.0, 0.1, "graph", 3, "shared", 0) and opts.seed == 0
    assert opts.max_frames == schema_defaults("$defs/nnet_train")["max_frames"]
    assert Parallel.defaults().strategy == schema_defaults("nnet.parallel")["strategy"]
    with pytest.raises(ParallelError, match="unknown parallel strategy 'gossip'"):
        Parallel.defaults(strategy="gossip")
    # a pipeline's stages: one learner each, so learners follows them
    assert Parallel.defaults(strategy="pipeline", stages=3).learners == 3
    assert Parallel.defaults(strategy="pipeline", stages=2, learners=2).learners == 2
    assert Parallel.defaults(strategy="pipeline", learners=2).stages is None
    with pytest.raises(ParallelError, match="stages is 2 but learners is 4: a pipeline runs one learner per stage"):
        Parallel.defaults(strategy="pipeline", stages=2, learners=4)
    with pytest.raises(ParallelError, match="stages is for the pipeline strategy, not ring; set learners"):
        Parallel.defaults(strategy="ring", stages=2)
    with pytest.raises(ConfigError, match="unknown settings colour"):
        Training.defaults(colour="red")


def test_a_saved_models_decoding_settings_load_with_todays_keys() -> None:
    """A bundle saved before a key existed decodes with its default (a TLG's penalty: the hybrids' one it used),
    and keys since removed are ignored."""
    saved = {"acoustic_scale": 0.2, "insertion_penalty": 1.5, "edge_filler_cost": 0.0,
             "tune": {"enabled": True, "edge_fragments": {"enabled": True}}}
    decode = Decoding.from_saved(saved)
    assert decode.acoustic_scale == 0.2 and decode.tlg_insertion_penalty == 1.5 and decode.beam == 8
    assert decode.tune.enabled and Decoding.from_saved(decode.as_dict()) == decode


def test_config_imports_no_network_code() -> None:
    """Resolving a config (every Snakemake job does) never imports torch or asrflow.nnet."""
    import subprocess
    import sys

    code = ("import sys, asrflow.config, asrflow.config.settings, asrflow.config.paths, asrflow.workflow; "
            "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('asrflow.nnet')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
