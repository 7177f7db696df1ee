"""The speechocean762 slice (12 speakers, continuous read speech at 16 kHz) through the whole DAG: import with
root-relative wav.scp paths, the corpus's own lexicon, the GMM chain (mono, tri, LDA+MLLT, SAT), one small
network on the SAT alignments and a chain TDNN (LF-MMI at one frame in three on the chain tree built from them),
tuned on held-out speakers, scoring by speaker group. The chain's last GMM and the
network are decoded and scored; the earlier GMMs go through the same decode rules in the yesno workflow test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.snakemake_run import snakemake

# its own pytest-xdist group: the slice runs in the other worker, beside the yesno runs, not after them
pytestmark = [pytest.mark.workflow, pytest.mark.xdist_group("speechocean762")]

OVERLAY = """\
experiment: speechocean762_mini
corpus: {{name: speechocean762, path: {path}}}
audio: {{sample_rate: 16000, max_duration: 20.0}}
dask: {{workers: 1}}
features: {{kinds: [mfcc, fbank], shard_utts: 40}}
lang: {{lexicon: corpus, lm_order: 2}}
gmm:
  shard_utts: 20
  mono: {{gaussians: 300, iterations: 20}}
  tri: {{leaves: 200, gaussians: 1000, iterations: 15, realign_iterations: [5, 10]}}
  lda: {{leaves: 200, gaussians: 1000, iterations: 15, realign_iterations: [5, 10], mllt_iterations: [2, 4]}}
  sat: {{leaves: 200, gaussians: 1000, iterations: 15, realign_iterations: [5, 10]}}
# narrow beams and small tuning grids: six training speakers make weak models, whose searches are wide
decode: {{beam: 9.0, max_active: 1000, shard_utts: 20,
         tune: {{acoustic_scale: [0.07, 0.1], insertion_penalty: [0.0, 1.0], search: coordinate}}}}
nnet:
  threads: 1
  valid_fraction: 0.1
  hold_out: speakers
  alignments: sat
  chain: {{source: sat, leaves: 200}}
  priors: posteriors
  prior_frames: 20000
  train: {{epochs: 4, max_frames: 4000, patience: 4}}
  models:
    dnn: {{type: dnn, hidden: 96, layers: 2, context: 5}}
    tdnn_chain: {{type: cnn, channels: [], tdnn_dim: 96, tdnn_dilations: [1, 1, 3, 3], subsampling: 3,
                 alignments: chain, features: fmllr, train: {{mmi: {{weight: 10.0, acoustic_scale: 1.0,
                                                                  denominator: phone_lm, cross_entropy: separate,
                                                                  tolerance: 1}}}},
                 decode: {{acoustic_scale: 1.0, tune: {{acoustic_scale: [1.0, 1.5], insertion_penalty: [0.0]}}}}}}
  decode: {{graph_beam: 8.0, max_active: 1000, shard_utts: 20,
           tune: {{acoustic_scale: [0.1, 0.2], insertion_penalty: [0.0, 1.0]}}}}
evaluation:
  systems: [sat_fmllr, dnn, tdnn_chain]
  test_sets: [test]
  groups: {{gender: {{}}, age: {{edges: [16], labels: [child, adult]}}}}
"""


@pytest.fixture(scope="module")
def mini_run(tmp_path_factory, mirror) -> Path:
    workdir = tmp_path_factory.mktemp("speechocean762")
    config = workdir / "speechocean762_mini.yaml"
    config.write_text(OVERLAY.format(path=mirror / "speechocean762-mini"))
    snakemake(workdir, "--cores", "2", "--configfile", str(config))
    return workdir


def test_the_slice_is_imported_with_its_speakers(mini_run: Path) -> None:
    res = mini_run / "results" / "speechocean762_mini"
    manifest = json.loads((res / "data" / "manifest.json").read_text())
    assert manifest["utterances"] == 240 and manifest["rejected"] == 0
    assert (res / "data" / "test" / "spk2age").read_text().count("\n") == 6
    lang = json.loads((res / "lang" / "train" / "manifest.json").read_text())
    assert lang["lexicon"] == "corpus" and lang["grapheme_fallback_words"] == 0 and lang["phones"] == 39
    assert 0 < lang["test_sets"]["test"]["oov_rate"] < 0.5


def test_every_system_is_scored_by_speaker_group(mini_run: Path) -> None:
    res = mini_run / "results" / "speechocean762_mini"
    for system in ("sat_fmllr", "dnn", "tdnn_chain"):
        score = json.loads((res / "score" / system / "test.json").read_text())
        assert score["n_utts"] == 120 and 0 < score["wer"] < 1.2, (system, score["wer"])
        groups = score["groups"]
        assert set(groups["gender"]) == {"f", "m"} and set(groups["age"]) == {"child", "adult"}
        assert sum(g["n_utts"] for g in groups["age"].values()) == 120
        assert "wer_in_vocabulary" in score
    table = (res / "compare" / "table.md").read_text()
    assert "| dnn | dnn | hybrid, SAT alignments |" in table


def test_the_gmm_chain_feeds_each_system_from_the_last(mini_run: Path) -> None:
    res = mini_run / "results" / "speechocean762_mini"
    lda = json.loads((res / "gmm" / "train" / "lda" / "manifest.json").read_text())
    assert lda["lda_dim"] == 40 and len(lda["mllt_gain_per_frame"]) == 2 and lda["aligned"] > 100
    assert (res / "gmm" / "train" / "lda" / "final.mat").is_file()
    sat = json.loads((res / "fmllr" / "train" / "sat" / "manifest.json").read_text())
    assert sat["started_from"].endswith("fmllr/train/lda") and sat["dim"] == 40
    tune = json.loads((res / "tune" / "train" / "dnn" / "tune.json").read_text())
    assert tune["search"] == "grid" and tune["utterances"] >= 12  # whole held-out speakers (20 a speaker)
    gmm_tune = json.loads((res / "tune" / "train" / "sat_fmllr" / "tune.json").read_text())
    assert gmm_tune["search"] == "coordinate" and len(gmm_tune["grid"]) <= 4


def test_the_chain_tree_converts_every_sat_alignment_and_its_network_decodes_a_third_of_the_frames(
        mini_run: Path) -> None:
    res = mini_run / "results" / "speechocean762_mini"
    chain = json.loads((res / "gmm" / "train" / "chain" / "manifest.json").read_text())
    sat = json.loads((res / "gmm" / "train" / "sat" / "manifest.json").read_text())
    assert chain["source"] == "sat" and chain["frame_subsampling"] == 3 and chain["split"] == "train"
    assert chain["converted"] == sat["aligned"] and chain["failed"] == 0 and 20 < chain["pdfs"] <= 200
    net = json.loads((res / "nnet" / "train" / "tdnn_chain" / "manifest.json").read_text())
    assert net["alignments"] == "chain" and net["rejected"] == 0 and net["classes"] == chain["pdfs"]
    assert "priors" not in net  # decoded without priors, whatever nnet.priors says
    import torch

    saved = torch.load(res / "nnet" / "train" / "tdnn_chain" / "final.pt", weights_only=True)
    assert "xent_output" not in saved["config"]  # the cross-entropy's own output stays in training
    assert not any(name.startswith("output.xent.") for name in saved["model"])
    decoded = json.loads((res / "decode" / "tdnn_chain" / "test" / "manifest.json").read_text())
    assert decoded["tuned"] and decoded["acoustic_scale"] in (1.0, 1.5)


def test_the_hybrid_divides_by_its_own_average_posteriors(mini_run: Path) -> None:
    """nnet.priors: posteriors: the dnn's priors (priors.npy, and final.pt, which keeps the alignments' too) are its
    average posteriors over about prior_frames frames of its training utterances."""
    import numpy as np
    import torch

    net = mini_run / "results" / "speechocean762_mini" / "nnet" / "train" / "dnn"
    manifest = json.loads((net / "manifest.json").read_text())
    priors = manifest["priors"]
    assert priors["source"] == "posteriors" and 15000 <= priors["frames"] <= 25000 and priors["kl_from_alignments"] > 0
    saved = torch.load(net / "final.pt", weights_only=True)
    np.testing.assert_array_equal(np.load(net / "priors.npy"), saved["priors"].numpy())
    assert not torch.allclose(saved["priors"], saved["alignment_priors"])
    assert np.exp(saved["priors"].numpy()).sum() == pytest.approx(1.0, abs=1e-4)
