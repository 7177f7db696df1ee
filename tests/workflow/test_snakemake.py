"""The whole yesno DAG (import → features → lang → gmm → graph → decode → score) through Snakemake."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest

REPO = Path(__file__).resolve().parents[2]
YESNO = REPO / "config" / "experiments" / "yesno.yaml"

pytestmark = pytest.mark.workflow


def snakemake(workdir: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("ASRFLOW_PARENT_RUN_ID", None)
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), *args],
                          cwd=workdir, env=env, capture_output=True, text=True, timeout=600)
    if check and proc.returncode != 0:
        pytest.fail(f"snakemake {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def jobs_planned(output: str) -> set[str]:
    return set(re.findall(r"^(?:local)?rule (\w+):", output, flags=re.M))


@pytest.fixture(scope="module")
def yesno_run(tmp_path_factory, mirror) -> Path:
    os.environ["ASRFLOW_DATA_MIRROR"] = str(mirror)
    workdir = tmp_path_factory.mktemp("workflow")
    snakemake(workdir, "--cores", "2", "--configfile", str(YESNO))
    return workdir


def test_outputs(yesno_run: Path) -> None:
    res = yesno_run / "results" / "yesno"
    assert len((res / "data" / "train" / "wav.scp").read_text().splitlines()) == 31
    assert len((res / "data" / "test" / "text").read_text().splitlines()) == 29
    assert (res / "data" / "report.tsv").read_text().splitlines() == ["utt_id\tfile\treason"]
    for kind, dim in (("mfcc", 13), ("fbank", 40)):
        assert len((res / "features" / kind / "feats.scp").read_text().splitlines()) == 60
        assert (res / "features" / kind / "test" / "cmvn.scp").is_file()
        assert f'"dim": {dim}' in (res / "features" / kind / "manifest.json").read_text()
    for name in ("data", "features.mfcc", "features.fbank"):
        assert (res / "logs" / f"{name}.log").stat().st_size > 0
        assert (res / "benchmarks" / f"{name}.tsv").is_file()
    assert "experiment: yesno" in (res / "config.yaml").read_text()
    assert "Dask dashboard: http://127.0.0.1:" in (res / "logs" / "data.log").read_text()


def test_gmm_systems_recognise_yesno(yesno_run: Path) -> None:
    res = yesno_run / "results" / "yesno"
    scores = {s: json.loads((res / "score" / s / "test.json").read_text()) for s in ("mono", "tri")}
    for summary in scores.values():
        assert {"wer", "ser", "sub", "del", "ins", "n_ref_words", "n_utts", "oov_rate", "rtf"} <= summary.keys()
        assert summary["n_ref_words"] == 232 and summary["n_utts"] == 29 and summary["oov_rate"] == 0.0
        assert 0 < summary["rtf"] < 0.2
    assert scores["tri"]["errors"] == 0, scores["tri"]
    assert scores["mono"]["errors"] <= 1, scores["mono"]  # one insertion: see README results
    tri = json.loads((res / "gmm" / "train" / "tri" / "manifest.json").read_text())
    assert tri["pdfs"] > 25 and tri["aligned"] == 31
    pdfs = (res / "gmm" / "train" / "tri" / "ali" / "pdfs.txt").read_text().splitlines()
    assert len(pdfs) == 31 and (res / "gmm" / "train" / "mono" / "alignment.png").stat().st_size > 10000


def test_mlflow_runs(yesno_run: Path) -> None:
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{yesno_run / 'results' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("yesno")
    runs = {r.info.run_name: r for r in client.search_runs([experiment.experiment_id])}
    assert set(runs) == {"pipeline-yesno", "data", "features-mfcc", "features-fbank", "lang-train",
                         "gmm-mono-train", "gmm-tri-train", "decode-mono-test", "decode-tri-test",
                         "score-mono-test", "score-tri-test"}
    history = client.get_metric_history(runs["gmm-mono-train"].info.run_id, "mono.loglike_per_frame")
    assert len(history) == 40 and history[-1].value > history[1].value
    assert runs["score-tri-test"].data.metrics["wer"] == 0.0
    parent = runs["pipeline-yesno"]
    assert parent.info.status == "FINISHED" and parent.data.params["corpus.name"] == "yesno"
    for stage in runs:
        if stage != "pipeline-yesno":
            assert runs[stage].data.tags["mlflow.parentRunId"] == parent.info.run_id
            assert runs[stage].info.status == "FINISHED"
    for stage in ("data", "features-mfcc", "features-fbank"):
        assert runs[stage].data.metrics["utterances"] == 60


def test_nothing_to_redo(yesno_run: Path) -> None:
    out = snakemake(yesno_run, "-n", "--cores", "2", "--configfile", str(YESNO))
    assert "Nothing to be done" in out.stdout + out.stderr


def test_feature_option_reruns_only_features(yesno_run: Path, tmp_path: Path) -> None:
    overlay = tmp_path / "more_mels.yaml"
    overlay.write_text("features:\n  fbank:\n    num_mel_bins: 30\n")
    out = snakemake(yesno_run, "-n", "--cores", "2", "--configfile", str(YESNO), str(overlay))
    planned = jobs_planned(out.stdout)
    assert planned == {"features", "all"}, out.stdout
    outputs = re.findall(r"^\s+output: (\S+)", out.stdout, flags=re.M)
    assert outputs == ["results/yesno/features/fbank"], out.stdout
    # a corpus option reruns the data stage and everything after it
    overlay.write_text("audio:\n  min_duration: 0.2\n")
    out = snakemake(yesno_run, "-n", "--cores", "2", "--configfile", str(YESNO), str(overlay))
    assert jobs_planned(out.stdout) == {"data", "features", "lang", "gmm", "graph", "decode", "score", "all"}
    snakemake(yesno_run, "-n", "--cores", "2", "--configfile", str(YESNO))  # restore resolved config


def test_config_typo_stops_with_the_key(tmp_path: Path) -> None:
    overlay = tmp_path / "typo.yaml"
    overlay.write_text("features:\n  mfcc:\n    num_cep: 12\n")
    out = snakemake(tmp_path, "-n", "--configfile", str(YESNO), str(overlay), check=False)
    assert out.returncode != 0
    assert "unknown config key 'features.mfcc.num_cep' (did you mean 'num_ceps'?)" in out.stderr
    assert "Traceback" not in out.stderr


def test_lint_is_clean(tmp_path: Path) -> None:
    out = snakemake(tmp_path, "--lint", "--configfile", str(YESNO), check=False)
    assert "Congratulations, your workflow is in a good condition!" in out.stdout + out.stderr


def test_hybrid_dnn_on_the_tri_alignments(yesno_run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A small DNN trained on the triphone alignments decodes yesno through the same HCLG."""
    from asrflow.data.datadir import read_table
    from asrflow.decode.decoder import DecodeOptions
    from asrflow.gmm.model import GmmModel
    from asrflow.gmm.shards import split_shards
    from asrflow.lang.graph import read_symbols
    from asrflow.nnet.data import FeatureDataset, read_int_archive
    from asrflow.nnet.hybrid import decode_shard, pdf_priors
    from asrflow.nnet.train import TrainOptions, train
    from asrflow.score.wer import score_corpus

    monkeypatch.chdir(yesno_run)  # archive indexes are relative to the Snakemake working directory
    res = yesno_run / "results" / "yesno"
    gmm = GmmModel.load(res / "gmm" / "train" / "tri")
    targets = read_int_archive(res / "gmm" / "train" / "tri" / "ali" / "pdfs.txt")
    data = FeatureDataset(res / "data", res / "features" / "fbank", "train", targets)
    opts = TrainOptions(epochs=15, max_frames=4000, lr=2e-3, warmup_steps=10, patience=4, seed=0)
    summary = train({"type": "dnn", "hidden": 128, "layers": 2, "context": 5}, opts, data, data,
                    gmm.am.num_pdfs, yesno_run / "dnn", log=lambda *_: None)
    assert summary["best_valid_loss"] < 1.5
    priors = pdf_priors(targets, gmm.am.num_pdfs)
    shards = split_shards(res / "data", res / "features" / "fbank", res / "lang" / "train", "test", 100, deltas=0)
    graph = str((res / "graph" / "train" / "tri" / "HCLG.fst").resolve())
    results = [decode_shard(s, str(yesno_run / "dnn" / "final.pt"), priors, gmm.to_bytes(), graph,
                            DecodeOptions(acoustic_scale=0.5)) for s in shards]
    id2word = {i: w for w, i in read_symbols(res / "lang" / "train" / "words.txt").items()}
    hyps = {u: " ".join(id2word[i] for i in ids if id2word[i] not in ("<eps>", "<SIL>"))
            for r in results for u, ids in r.hyps.items()}
    score, _ = score_corpus(read_table(res / "data" / "test" / "text"), hyps)
    assert score["wer"] < 0.05, score
