from pathlib import Path

from asrflow.data.stage import prepare_data
from asrflow.features.bench import run_benchmark

from ..conftest import make_config


def test_benchmark_runs_and_reports(tmp_path: Path, use_mirror, dask_client_1) -> None:
    config = make_config(tmp_path, corpus={"name": "yesno"}, features={"kinds": ["mfcc"], "shard_utts": 30})
    prepare_data(config, tmp_path / "data", dask_client_1, log=lambda *_: None)
    report = run_benchmark(config, tmp_path / "data", [1], tmp_path / "bench.json", repeats=1, log=lambda *_: None)
    row = report["kinds"]["mfcc"]
    assert row["asrflow"][1]["x_real_time"] > 0 and row["kaldi_native_fbank"]["x_real_time"] > 0
    assert row["agreement"]["correlation"] > 0.99999 and row["agreement"]["max_abs_diff"] < 5e-3
    assert "kaldi-native-fbank, 1 process" in report["table"]
    assert (tmp_path / "bench.json").is_file()
