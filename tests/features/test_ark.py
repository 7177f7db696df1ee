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


def test_compressed_archives_are_kaldis_speech_feature_matrices(tmp_path: Path) -> None:
    """compress: Kaldi's compressed matrix (kSpeechFeature: a byte a value, each column quantised piecewise
    between its 0th, 25th, 75th and 100th percentiles in 64, 128 and 63 steps), which kaldiio reads back
    within half the coarsest step; matrices given already encoded are written as they are."""
    from asrflow.features.ark import decoded, matrix_bytes

    rng = np.random.default_rng(0)
    feats = (rng.standard_normal((300, 40)) * 4 + 10).astype(np.float32)
    lines = write_ark(tmp_path / "c.ark", [("u1", feats), ("u2", matrix_bytes(feats[:7], compress=True))],
                      compress=True)
    (tmp_path / "c.scp").write_text("\n".join(lines) + "\n")
    loaded = dict(kaldiio.load_scp(str(tmp_path / "c.scp")).items())
    span = feats.max(axis=0) - feats.min(axis=0)
    assert np.all(np.abs(loaded["u1"] - feats) <= span / 126)
    assert loaded["u2"].shape == (7, 40)
    np.testing.assert_array_equal(decoded(matrix_bytes(feats, compress=True)), loaded["u1"])
    plain = len(matrix_bytes(feats))
    assert len(matrix_bytes(feats, compress=True)) < plain / 3.5
    with open(tmp_path / "c.ark", "rb") as ark:
        assert ark.read(8) == b"u1 \0BCM "
