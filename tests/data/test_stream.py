"""The data stage streams a corpus: the same data dirs whether its sort spills to disk or not, whether the
recipe's tables are sorted or not, and an id listed in two splits is kept once."""

from __future__ import annotations

from pathlib import Path

import pytest

from asrflow.data import read_data_dir
from asrflow.data.stage import prepare_data

from ..conftest import make_config, write_wav


def _kaldi_corpus(root: Path) -> Path:
    """Two data dirs, ``train`` (sorted) and ``test`` (its tables reversed), sharing one utterance id."""
    for split, speakers in (("train", ("a", "b", "c")), ("test", ("d", "e"))):
        folder = root / split
        folder.mkdir(parents=True)
        ids = [f"{spk}-{i}" for spk in speakers for i in range(3)] + (["a-0"] if split == "test" else [])
        for utt in ids:
            write_wav(root / "audio" / split / f"{utt}.wav", 0.3 + 0.05 * int(utt[-1]), freq=200 + 50 * len(ids))
        order = sorted(ids) if split == "train" else sorted(ids, reverse=True)
        (folder / "wav.scp").write_text("".join(f"{u} audio/{split}/{u}.wav\n" for u in order))
        (folder / "text").write_text("".join(f"{u} word {u[-1]}\n" for u in order))
        (folder / "utt2spk").write_text("".join(f"{u} {u[0]}\n" for u in order))
    return root


def _tables(folder: Path) -> dict[str, str]:
    return {p.relative_to(folder).as_posix(): p.read_text() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != "manifest.json"}


def test_the_stream_gives_the_same_dirs_with_or_without_runs_on_disk(tmp_path: Path, dask_client_1,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from asrflow.data import stage

    corpus = _kaldi_corpus(tmp_path / "corpus")
    config = make_config(tmp_path, corpus={"name": "kaldi_dir", "path": str(corpus)},
                         audio={"sample_rate": 8000, "speed_perturb": [0.9, 1.0, 1.1]})
    whole = prepare_data(config, tmp_path / "whole", dask_client_1, log=lambda *_: None)
    monkeypatch.setattr(stage, "SORT_LINES", 4)  # five runs of at most four utterances, merged
    spilled = prepare_data(config, tmp_path / "spilled", dask_client_1, log=lambda *_: None)
    assert _tables(tmp_path / "whole") == _tables(tmp_path / "spilled")
    assert (whole.fingerprint, whole.splits, whole.rejected) == (spilled.fingerprint, spilled.splits, spilled.rejected)
    assert not (tmp_path / "spilled" / ".sort").exists() and not (tmp_path / "spilled" / ".valid.jsonl").exists()
    # the id listed in both splits is kept once, in the split listed first (the data dirs in name order: test)
    report = (tmp_path / "whole" / "report.tsv").read_text().splitlines()
    assert len(report) == 2 and report[1].startswith("a-0\t") and "duplicate utterance id" in report[1]
    assert "audio/train/a-0.wav" in report[1]
    assert [u.utt_id for u in read_data_dir(tmp_path / "whole" / "test")] == ["a-0"] + [f"{s}-{i}" for s in "de"
                                                                                      for i in range(3)]
    assert {u.utt_id for u in read_data_dir(tmp_path / "whole" / "train")} == {f"{s}-{i}" for s in "abc"
                                                                              for i in range(3)} - {"a-0"}
    assert whole.utterances == 15 and whole.splits["train"]["utterances"] == 8
    perturbed = read_data_dir(tmp_path / "whole" / "train_sp")
    assert [u.utt_id for u in perturbed] == sorted(u.utt_id for u in perturbed) and len(perturbed) == 24
    assert {u.speed for u in perturbed} == {0.9, 1.0, 1.1} and whole.splits["train_sp"]["speakers"] == 9
    assert (tmp_path / "whole" / "train_sp" / "spk2utt").read_text().startswith("a a-1 a-2\n")
