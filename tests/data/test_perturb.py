"""Speed perturbation: the copies' ids, durations and audio (tempo and pitch both scale)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from asrflow.data import Utterance, read_data_dir, write_data_dir
from asrflow.data.perturb import copy_factors, copy_ids, perturb_speed, perturbed_split, with_copies

RATE = 8000


def _peak_hz(samples: np.ndarray, rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(samples * np.hanning(len(samples))))
    return float(np.fft.rfftfreq(len(samples), 1 / rate)[np.argmax(spectrum)])


@pytest.mark.parametrize("factor", [0.9, 1.1])
def test_a_copy_is_shorter_and_higher_by_its_factor(factor: float) -> None:
    tone = np.sin(2 * np.pi * 440.0 * np.arange(RATE) / RATE).astype(np.float32)  # 1 s of 440 Hz
    fast = perturb_speed(tone, RATE, factor, RATE)
    assert abs(len(fast) - RATE / factor) <= 1
    assert _peak_hz(fast, RATE) == pytest.approx(440.0 * factor, abs=2.0)
    assert perturb_speed(tone, RATE, 1.0, RATE) is tone  # no resampling at all


def test_resampling_and_perturbing_are_one_step() -> None:
    tone = np.sin(2 * np.pi * 300.0 * np.arange(16000) / 16000).astype(np.float32)
    out = perturb_speed(tone, 16000, 1.1, RATE)  # 16 kHz source, 8 kHz features
    assert abs(len(out) - RATE / 1.1) <= 1 and _peak_hz(out, RATE) == pytest.approx(330.0, abs=2.0)
    with pytest.raises(ValueError, match="positive"):
        perturb_speed(tone, 16000, 0.0, RATE)


def test_copies_are_named_as_kaldi_names_them() -> None:
    utts = [Utterance("a-1", "a", "/x/a1.wav", "one", 0.9, RATE, "a-1"),
            Utterance("b-2", "b", "/x/b2.wav", "two", 1.1, RATE, "b-2")]
    assert copy_factors([1.1, 1.0, 0.9, 1.1]) == [0.9, 1.1]
    out = with_copies(utts, [0.9, 1.0, 1.1])
    assert [u.utt_id for u in out] == ["a-1", "b-2", "sp0.9-a-1", "sp0.9-b-2", "sp1.1-a-1", "sp1.1-b-2"]
    slow = out[2]
    assert (slow.speaker, slow.recording, slow.audio, slow.text) == ("sp0.9-a", "sp0.9-a-1", "/x/a1.wav", "one")
    assert slow.duration == pytest.approx(1.0) and slow.speed == 0.9
    assert copy_ids(["a-1", "b-2"], [0.9, 1.0, 1.1]) == {u.utt_id for u in out[2:]}
    assert copy_ids(["sp1-3"], [1.0]) == set()  # ids are made, never parsed: any corpus id is safe
    assert perturbed_split("loso_george_train") == "loso_george_train_sp"


def test_the_data_dir_keeps_the_factor(tmp_path: Path) -> None:
    utts = with_copies([Utterance("a-1", "a", "/x/a1.wav", "one", 0.9, RATE, "a-1")], [1.1])
    write_data_dir(tmp_path, utts)
    assert (tmp_path / "utt2speed").read_text() == "a-1 1\nsp1.1-a-1 1.1\n"
    assert (tmp_path / "wav.scp").read_text() == "a-1 /x/a1.wav\nsp1.1-a-1 /x/a1.wav\n"
    assert read_data_dir(tmp_path) == sorted(utts, key=lambda u: u.utt_id)
    write_data_dir(tmp_path, utts[:1])  # no copies left: no utt2speed
    assert not (tmp_path / "utt2speed").exists() and read_data_dir(tmp_path)[0].speed == 1.0
