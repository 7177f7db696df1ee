"""A corpus with every fault the data stage must report, and nothing else lost."""

from __future__ import annotations

import csv
import json
import struct
from pathlib import Path

import pytest

from asrflow.data import read_data_dir
from asrflow.data.audio import wav_truncation
from asrflow.data.stage import prepare_data

from ..conftest import make_config, write_wav

ODD_NAME = "take 'one' \"quoted\".wav"


def build_faulty_corpus(root: Path) -> Path:
    audio = root / "audio"
    write_wav(audio / "good1.wav", 0.6)
    write_wav(audio / "good2.wav", 0.7, freq=300)
    write_wav(audio / ODD_NAME, 0.5)
    write_wav(audio / "resampled.wav", 0.5, rate=16000)  # other rate: kept, resampled later
    full = write_wav(audio / "truncated.wav", 1.0).read_bytes()
    (audio / "truncated.wav").write_bytes(full[: len(full) // 2])
    (audio / "zero.wav").write_bytes(b"")
    (audio / "text.wav").write_text("this is not audio\n")
    write_wav(audio / "untranscribed.wav", 0.5)
    write_wav(audio / "punct.wav", 0.5)
    write_wav(audio / "dup.wav", 0.5)
    write_wav(audio / "nonutf.wav", 0.5)
    write_wav(audio / "tooshort.wav", 0.05)
    header_only = full[:44]
    (audio / "nosamples.wav").write_bytes(header_only[:40] + struct.pack("<I", 0))
    lines = [
        b"path\ttext\tspeaker",
        b"good1.wav\tHello world\tspk1",
        b"good2.wav\tPress 1, please!\tspk1",
        f"{ODD_NAME}\tquoted file\tspk2".encode(),
        b"resampled.wav\tsixteen k\tspk2",
        b"truncated.wav\ttruncated file\tspk1",
        b"zero.wav\tzero bytes\tspk1",
        b"text.wav\tnot audio\tspk1",
        b"punct.wav\t?!...\tspk1",
        b"dup.wav\tfirst copy\tspk1",
        b"dup.wav\tsecond copy\tspk1",
        b"nonutf.wav\tcaf\xe9 latin-1\tspk1",
        b"tooshort.wav\ttoo short\tspk1",
        b"nosamples.wav\tno samples\tspk1",
        b"missing.wav\tnever recorded\tspk1",
    ]
    tsv = root / "transcripts.tsv"
    tsv.write_bytes(b"\n".join(lines) + b"\n")
    return tsv


EXPECTED_REJECTIONS = {
    "spk1-truncated": "truncated WAV",
    "spk1-zero": "audio file is empty (0 bytes)",
    "spk1-text": "cannot decode audio",
    "spk-untranscribed": "no transcript",
    "spk1-punct": "transcript empty after normalisation",
    "spk1-dup": "duplicate utterance id",
    "spk1-nonutf": "is not valid UTF-8",
    "spk1-tooshort": "below audio.min_duration",
    "spk1-nosamples": "audio has no samples",
    "spk1-missing": "audio file not found",
}
EXPECTED_VALID = {"spk1-good1", "spk1-good2", "spk2-take_one_quoted_", "spk2-resampled", "spk1-dup"}


@pytest.fixture()
def faulty(tmp_path: Path) -> tuple[dict, Path]:
    tsv = build_faulty_corpus(tmp_path / "corpus")
    config = make_config(tmp_path, corpus={"name": "tsv", "path": str(tmp_path / "corpus" / "audio"),
                                           "transcripts": str(tsv)})
    return config, tmp_path / "out"


def test_every_fault_reported_nothing_else_lost(faulty, dask_client_1) -> None:
    config, out = faulty
    summary = prepare_data(config, out, dask_client_1, log=lambda *_: None)
    with open(out / "report.tsv", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle, delimiter="\t"))
    reasons = {r["utt_id"]: r["reason"] for r in rows}
    for utt, fragment in EXPECTED_REJECTIONS.items():
        assert fragment in reasons.get(utt, ""), (utt, reasons.get(utt))
    assert len(rows) == len(EXPECTED_REJECTIONS)
    valid = {u.utt_id for u in read_data_dir(out / "all")}
    assert valid == EXPECTED_VALID
    assert summary.utterances == len(EXPECTED_VALID) and summary.rejected == len(EXPECTED_REJECTIONS)
    manifest = json.loads((out / "manifest.json").read_text())
    assert sum(manifest["rejected_by_reason"].values()) == len(EXPECTED_REJECTIONS)
    # The duplicate keeps its first transcript; text is normalised; odd file names survive.
    utts = {u.utt_id: u for u in read_data_dir(out / "all")}
    assert utts["spk1-dup"].text == "first copy"
    assert utts["spk1-good2"].text == "press one please"
    assert utts["spk2-take_one_quoted_"].audio.endswith(ODD_NAME)
    assert utts["spk2-resampled"].sample_rate == 16000
    splits = sum(v["utterances"] for v in manifest["splits"].values())
    assert splits == len(EXPECTED_VALID)


def test_nothing_valid_is_a_clear_error(tmp_path: Path, dask_client_1) -> None:
    from asrflow.corpus import CorpusError

    (tmp_path / "audio").mkdir()
    (tmp_path / "audio" / "bad.wav").write_text("nope")
    tsv = tmp_path / "t.tsv"
    tsv.write_text("bad.wav\thello\n")
    config = make_config(tmp_path, corpus={"name": "tsv", "path": str(tmp_path / "audio"), "transcripts": str(tsv)})
    with pytest.raises(CorpusError, match="no utterance of tsv survived validation"):
        prepare_data(config, tmp_path / "out", dask_client_1, log=lambda *_: None)
    assert "cannot decode" in (tmp_path / "out" / "report.tsv").read_text()


def test_wav_truncation_detects_short_data(tmp_path: Path) -> None:
    path = write_wav(tmp_path / "a.wav", 1.0)
    assert wav_truncation(path) is None
    path.write_bytes(path.read_bytes()[:-100])
    assert "header declares 16000 data bytes, file holds 15900" in wav_truncation(path)


def test_fast_wav_reader_equals_libsndfile(tmp_path: Path) -> None:
    import numpy as np
    import soundfile as sf

    from asrflow.data.audio import _read_pcm16_wav, read_audio

    stereo = np.stack([np.linspace(-1, 0.99, 800), np.linspace(0.5, -0.5, 800)], axis=1)
    sf.write(tmp_path / "s.wav", stereo, 16000, subtype="PCM_16")
    fast, rate = _read_pcm16_wav(str(tmp_path / "s.wav"))
    ref, _ = sf.read(tmp_path / "s.wav", dtype="float32")
    assert rate == 16000
    np.testing.assert_array_equal(fast, ref[:, 0])
    sf.write(tmp_path / "f.wav", stereo, 8000, subtype="FLOAT")
    assert _read_pcm16_wav(str(tmp_path / "f.wav")) is None  # not PCM16: libsndfile path
    samples, _ = read_audio(str(tmp_path / "f.wav"))
    np.testing.assert_allclose(samples, stereo[:, 0], atol=1e-6)
