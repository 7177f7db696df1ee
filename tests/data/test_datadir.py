from pathlib import Path

from asrflow.data import Utterance, read_data_dir, write_data_dir


def test_round_trip_and_kaldi_layout(tmp_path: Path) -> None:
    utts = [
        Utterance("b-2", "b", "/x/b 2.wav", "two words", 1.25, 8000, "b-2"),
        Utterance("a-1", "a", "/x/a.wav", "one", 0.5, 16000, "a-1"),
        Utterance("a-0", "a", "/x/a0.wav", "zero", 0.75, 8000, "a-0"),
    ]
    write_data_dir(tmp_path, utts)
    assert (tmp_path / "wav.scp").read_text().splitlines()[2] == "b-2 /x/b 2.wav"
    assert (tmp_path / "spk2utt").read_text() == "a a-0 a-1\nb b-2\n"
    assert not (tmp_path / "segments").exists()
    back = read_data_dir(tmp_path)
    assert [u.utt_id for u in back] == ["a-0", "a-1", "b-2"]
    assert back[2].audio == "/x/b 2.wav" and back[1].sample_rate == 16000


def test_segments_written_when_needed(tmp_path: Path) -> None:
    utts = [Utterance("s-1", "s", "/r.wav", "hi", 1.0, 8000, "rec", 0.0, 1.0),
            Utterance("s-2", "s", "/r.wav", "yo", 1.0, 8000, "rec", 1.0, None)]
    write_data_dir(tmp_path, utts)
    assert (tmp_path / "wav.scp").read_text() == "rec /r.wav\n"
    assert (tmp_path / "segments").read_text() == "s-1 rec 0.000 1.0\ns-2 rec 1.000 -1\n"
    back = read_data_dir(tmp_path)
    assert back[1].start == 1.0 and back[1].end is None
