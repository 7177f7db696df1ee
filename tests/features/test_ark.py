from pathlib import Path

import kaldiio
import numpy as np
import pytest

from asrflow.features import read_scp, write_ark


def test_kaldiio_reads_our_archives(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    mats = {"u1": rng.standard_normal((5, 3)).astype(np.float32), "u2": np.zeros((1, 3), np.float32),
            "spk": rng.standard_normal((2, 4))}
    lines = write_ark(tmp_path / "a.ark", mats.items())
    (tmp_path / "a.scp").write_text("\n".join(lines) + "\n")
    loaded = dict(kaldiio.load_scp(str(tmp_path / "a.scp")).items())
    for key, mat in mats.items():
        np.testing.assert_array_equal(loaded[key], mat)
        assert loaded[key].dtype == mat.dtype
    assert dict(kaldiio.load_ark(str(tmp_path / "a.ark"))).keys() == mats.keys()
    assert list(read_scp(tmp_path / "a.scp")) == ["u1", "u2", "spk"]
    assert not list(tmp_path.glob(".*.tmp"))


def test_bad_key_leaves_no_archive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="whitespace"):
        write_ark(tmp_path / "b.ark", [("ok", np.zeros((1, 1), np.float32)), ("bad key", np.zeros((1, 1), np.float32))])
    assert not list(tmp_path.iterdir())
