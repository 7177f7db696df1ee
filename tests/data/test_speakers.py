"""Speaker attributes a corpus gives (gender, age) reach every data dir, speed-perturbed copies too."""

from __future__ import annotations

from pathlib import Path

from asrflow.data.datadir import read_table
from asrflow.data.stage import prepare_data
from tests.conftest import make_config


def test_speechocean762_data_dirs_keep_age_and_gender(use_mirror: Path, tmp_path: Path, dask_client_1) -> None:
    config = make_config(tmp_path, corpus={"name": "speechocean762", "path": str(use_mirror / "speechocean762-mini")},
                         audio={"sample_rate": 16000, "speed_perturb": [0.9, 1.0, 1.1]})
    summary = prepare_data(config, tmp_path / "data", dask_client_1, log=lambda *_: None)
    assert summary.utterances == 240 and summary.rejected == 0
    data = tmp_path / "data"
    assert read_table(data / "train" / "spk2age")["0001"] == "6"
    assert read_table(data / "test" / "spk2gender") == {"0003": "m", "0024": "f", "0049": "f", "0092": "f",
                                                        "0461": "m", "0765": "m"}
    copies = read_table(data / "train_sp" / "spk2gender")
    assert copies["sp0.9-0006"] == copies["sp1.1-0006"] == copies["0006"] == "f" and len(copies) == 18
    assert set(read_table(data / "all" / "spk2age")) == set(read_table(data / "all" / "spk2utt"))
