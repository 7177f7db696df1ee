from pathlib import Path

import pytest
import yaml

from asrflow.config import ConfigError, load_config, resolve_config, section_fingerprint, write_resolved

REPO = Path(__file__).resolve().parents[2]


def test_defaults_filled_deeply() -> None:
    config = resolve_config({"experiment": "x", "corpus": {"name": "yesno"}})
    assert config["features"]["mfcc"]["num_ceps"] == 13
    assert config["features"]["fbank"]["num_mel_bins"] == 80
    assert config["dask"]["cluster"] == "local"
    assert config["results_dir"] == "results"


def test_a_networks_train_overrides_overlay_nested_sections_key_by_key() -> None:
    """A model's ``train.specaugment`` / ``train.mmi`` names only what it changes; the rest stays."""
    from asrflow.config import model_train

    config = resolve_config({"experiment": "x", "corpus": {"name": "yesno"}, "nnet": {
        "train": {"specaugment": {"freq_width": 4}},
        "models": {"d": {"type": "dnn", "train": {"lr": 0.01, "mmi": {"weight": 0.5},
                                                   "specaugment": {"freq_masks": 2}}}}}})
    train = model_train(config, "d")
    assert train["lr"] == 0.01 and train["mmi"] == {"weight": 0.5, "acoustic_scale": 0.1, "denominator": "graph",
                                                    "phone_lm_order": 3, "cross_entropy": "shared",
                                                    "tolerance": 0}
    assert train["specaugment"]["freq_masks"] == 2 and train["specaugment"]["freq_width"] == 4
    assert train["specaugment"]["time_width"] == 20


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"experiment": "x", "corpus": {"name": "yesno"}, "featurs": {}},
         "unknown config key 'featurs' (did you mean 'features'?)"),
        ({"experiment": "x", "corpus": {"name": "yesno"}, "features": {"mfcc": {"num_cep": 13}}},
         "unknown config key 'features.mfcc.num_cep' (did you mean 'num_ceps'?)"),
        ({"experiment": "x", "corpus": {"name": "yesno"}, "features": {"dither": "lots"}},
         "config key 'features.dither': 'lots' is not of type 'number'"),
        ({"experiment": "x"}, "missing required config key 'corpus.name'"),
        ({"corpus": {"name": "yesno"}}, "missing required config key 'experiment'"),
        ({"experiment": "x", "corpus": {"name": "timit"}}, "config key 'corpus.name'"),
        ({"experiment": "x", "corpus": {"name": "yesno"}, "audio": {"min_duration": 5, "max_duration": 1}},
         "audio.min_duration"),
        ({"experiment": "x", "corpus": {"name": "yesno"}, "audio": {"speed_perturb": [0.9, 3.0]}},
         "config key 'audio.speed_perturb.1': 3.0 is greater than the maximum of 2.0"),
        ({"experiment": "x", "corpus": {"name": "yesno"}, "audio": {"speed_perturb": [1.0]},
          "nnet": {"models": {"dnn": {"type": "dnn", "train": {"speed_perturb": True}}}},
          "evaluation": {"systems": ["dnn"]}},
         "config key 'nnet.models.dnn': speed_perturb is on but audio.speed_perturb has no factor other than 1.0"),
        ({"experiment": "x", "corpus": {"name": "yesno"}, "audio": {"speed_perturb": [0.9, 1.1]},
          "nnet": {"models": {"a": {"type": "dnn", "train": {"speed_perturb": True}}, "b": {"type": "dnn"},
                              "e": {"type": "ensemble", "members": ["a", "b"]}}},
          "evaluation": {"systems": ["e"]}},
         "config key 'nnet.models.e.members': a train with speed_perturb and the others without"),
        ({"experiment": "x", "corpus": {"name": "yesno"}, "features": {"kinds": ["fbank"]},
          "nnet": {"models": {"a": {"type": "dnn", "features": "fmllr"}}}, "evaluation": {"systems": ["a"]}},
         "config key 'nnet.models.a.features': 'fmllr' needs mfcc features, which are not extracted"),
        ({"experiment": "x", "corpus": {"name": "yesno"}, "features": {"kinds": ["mfcc"]},
          "nnet": {"models": {"a": {"type": "dnn"}}}, "evaluation": {"systems": ["a"]}},
         "config key 'nnet.features': 'fbank' needs fbank features, which are not extracted"),
        ({"experiment": "x", "corpus": {"name": "yesno"}, "features": {"kinds": ["mfcc", "fbank"]},
          "nnet": {"models": {"a": {"type": "dnn", "features": "fmllr"}, "b": {"type": "dnn"},
                              "e": {"type": "ensemble", "members": ["a", "b"]}}},
          "evaluation": {"systems": ["e"]}},
         "config key 'nnet.models.e.members': the members read different features (a: fmllr, b: fbank)"),
        ({"experiment": "x", "corpus": {"name": "yesno"},
          "nnet": {"cmvn": "utterance", "models": {"a": {"type": "dnn"}, "b": {"type": "dnn", "cmvn": "speaker"},
                                                   "e": {"type": "ensemble", "members": ["a", "b"]}}},
          "evaluation": {"systems": ["e"]}},
         "config key 'nnet.models.e.members': the members normalise their features differently (a: cmvn "
         "utterance, b: cmvn speaker)"),
        ({"experiment": "x", "corpus": {"name": "yesno"},
          "nnet": {"models": {"a": {"type": "dnn"}, "s": {"type": "adapted", "source": "a"}}},
          "evaluation": {"systems": ["s"]}},
         "config key 'nnet.models.s.type': 'adapted' is not one of ['dnn', 'lstm', 'cnn', 'conformer', 'ensemble']"),
        ({"experiment": "x", "corpus": {"name": "yesno"}, "nnet": {"cmvn": "global"}},
         "config key 'nnet.cmvn': 'global' is not one of ['speaker', 'utterance']"),
        ({"experiment": "x", "corpus": {"name": "yesno"}, "features": {"kinds": ["fbank"]},
          "evaluation": {"systems": ["tri_fmllr"]}},
         "config key 'evaluation.systems': tri_fmllr adapts the GMM's MFCC features; add mfcc to features.kinds"),
        ({"experiment": "x", "corpus": {"name": "yesno"}, "evaluation": {"systems": ["tri_fmlr"]}},
         "'tri_fmlr' is neither a GMM system (mono, tri, lda, mono_fmllr, tri_fmllr, lda_fmllr, sat_fmllr) nor a "
         "network in nnet.models (did you mean 'tri_fmllr'?)"),
        ({"experiment": "x", "corpus": {"name": "yesno"}, "evaluation": {"systems": ["sat"]}},
         "config key 'evaluation.systems': sat is trained on speaker-adapted features and decodes them only: "
         "evaluate sat_fmllr"),
        ({"experiment": "x", "corpus": {"name": "yesno"},
          "nnet": {"models": {"a": {"type": "dnn", "alignments": "sat"}, "b": {"type": "dnn"},
                              "e": {"type": "ensemble", "members": ["a", "b"]}}},
          "evaluation": {"systems": ["e"]}},
         "config key 'nnet.models.e.members': the members train on the alignments of different GMMs (a: sat, b: tri)"),
        ({"experiment": "x", "corpus": {"name": "yesno"},
          "nnet": {"models": {"a": {"type": "cnn", "channels": [], "subsampling": 3}}},
          "evaluation": {"systems": ["a"]}},
         "config key 'nnet.models.a.subsampling': a hybrid on the tri GMM's tree outputs every frame (its targets are "
         "the GMM's frames); subsampling 3 needs alignments: chain"),
        ({"experiment": "x", "corpus": {"name": "yesno"},
          "nnet": {"models": {"a": {"type": "cnn", "channels": [], "alignments": "chain"}}},
          "evaluation": {"systems": ["a"]}},
         "config key 'nnet.models.a': a network on the chain tree outputs one frame in nnet.chain.frame_subsampling "
         "(3): a cnn (TDNN) with subsampling 3, not a cnn with subsampling 1"),
        ({"experiment": "x", "corpus": {"name": "yesno"},
          "nnet": {"models": {"a": {"type": "cnn", "channels": [], "alignments": "chain", "subsampling": 3,
                                    "decode": {"frame_skip": 2}}}}, "evaluation": {"systems": ["a"]}},
         "config key 'nnet.models.a.decode.frame_skip': a network on the chain tree already outputs one frame in 3"),
    ],
)
def test_errors_name_the_key(raw: dict, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        resolve_config(raw)
    assert message in str(err.value)


def test_missing_required_nested_key() -> None:
    with pytest.raises(ConfigError, match="missing required config key 'corpus.name'"):
        resolve_config({"experiment": "x", "corpus": {"language": "en"}})


@pytest.mark.parametrize("name", ["config/config.yaml", *sorted(p.relative_to(REPO).as_posix()
                                                                 for p in (REPO / "config").glob("*/*.yaml"))])
def test_shipped_configs_validate(name: str) -> None:
    paths = [REPO / "config/config.yaml"] + ([REPO / name] if name != "config/config.yaml" else [])
    config = load_config(*paths)
    assert config["experiment"]


def test_overlay_and_bad_yaml(tmp_path: Path) -> None:
    base = tmp_path / "a.yaml"
    base.write_text("experiment: a\ncorpus: {name: yesno}\nfeatures: {mfcc: {num_ceps: 20}}\n")
    over = tmp_path / "b.yaml"
    over.write_text("features: {fbank: {num_mel_bins: 40}}\n")
    config = load_config(base, over)
    assert config["features"]["mfcc"]["num_ceps"] == 20 and config["features"]["fbank"]["num_mel_bins"] == 40
    bad = tmp_path / "bad.yaml"
    bad.write_text("experiment: [unclosed\n")
    with pytest.raises(ConfigError, match="bad.yaml is not valid YAML"):
        load_config(bad)
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "nope.yaml")


def test_write_resolved_keeps_mtime_when_unchanged(tmp_path: Path) -> None:
    config = resolve_config({"experiment": "x", "corpus": {"name": "yesno"}})
    path = tmp_path / "config.yaml"
    assert write_resolved(config, path)
    assert not write_resolved(config, path)
    assert yaml.safe_load(path.read_text()) == config


def test_fingerprint_tracks_only_its_sections() -> None:
    a = resolve_config({"experiment": "x", "corpus": {"name": "yesno"}})
    b = resolve_config({"experiment": "x", "corpus": {"name": "yesno"}, "features": {"dither": 0.0}})
    assert section_fingerprint(a, "corpus") == section_fingerprint(b, "corpus")
    assert section_fingerprint(a, "features") != section_fingerprint(b, "features")


def test_an_overlay_replaces_the_networks_and_checks_their_options(tmp_path: Path) -> None:
    """nnet.models is replaced whole by an overlay; a size key the model type lacks is named."""
    from asrflow.config.schema import merge, reapply_replaced

    yesno = load_config(REPO / "config/config.yaml", REPO / "config/experiments/yesno.yaml")
    fsdd = load_config(REPO / "config/config.yaml")
    assert yesno["nnet"]["models"]["ctc"]["vocab_size"] == 64  # the default, not FSDD's 32
    assert fsdd["nnet"]["models"]["ctc"]["vocab_size"] == 32
    assert yesno["nnet"]["models"]["dnn"]["dropout"] == 0.1  # the model's default, not FSDD's 0.15
    merged = merge(fsdd, yaml.safe_load((REPO / "config/experiments/yesno.yaml").read_text()), ("x",))
    assert merged["nnet"]["models"]["ctc"]["vocab_size"] == 32  # what a plain deep merge (Snakemake's) gives ...
    fixed = reapply_replaced(merged, [REPO / "config/experiments/yesno.yaml"])
    assert "vocab_size" not in fixed["nnet"]["models"]["ctc"]  # ... and what setup_workflow restores
    bad = tmp_path / "bad.yaml"
    bad.write_text("nnet: {models: {dnn: {type: dnn, bidirectional: true}}}\nevaluation: {systems: [dnn]}\n")
    with pytest.raises(ConfigError, match=r"nnet.models.dnn.*bidirectional not an option of a dnn model"):
        load_config(REPO / "config/config.yaml", bad)
    typo = tmp_path / "typo.yaml"
    typo.write_text("evaluation: {systems: [mono, lstn]}\n")
    with pytest.raises(ConfigError, match=r"'lstn' is neither.*did you mean 'lstm'"):
        load_config(REPO / "config/config.yaml", typo)


def test_every_experiment_and_study_config_is_valid() -> None:
    """Each experiment over the defaults, each study over the defaults or the experiment it names first."""
    for experiment in sorted((REPO / "config/experiments").glob("*.yaml")):
        load_config(REPO / "config/config.yaml", experiment)
    for study in sorted((REPO / "config/studies").glob("*.yaml")):
        base = REPO / "config/experiments" / f"{study.stem.split('_')[0]}.yaml"
        load_config(REPO / "config/config.yaml", *([base] if base.is_file() else []), study)
