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


def test_a_dir_is_read_in_id_order_whether_or_not_its_tables_are_sorted(tmp_path: Path) -> None:
    """iter_data_dir joins sorted tables a line at a time; tables written out of order by hand are read whole
    and give the same utterances; a missing entry is named."""
    import pytest

    from asrflow.data.datadir import DataDirError, iter_data_dir

    utts = [Utterance(f"s{i % 3}-{i:02d}", f"s{i % 3}", f"/x/{i}.wav", f"word {i}", 1.0 + i, 16000, f"s{i % 3}-{i:02d}",
                      speed=1.1 if i % 4 == 0 else 1.0) for i in range(12)]
    write_data_dir(tmp_path / "sorted", utts)
    streamed = list(iter_data_dir(tmp_path / "sorted"))
    assert streamed == sorted(utts, key=lambda u: u.utt_id)
    shuffled = tmp_path / "shuffled"
    shuffled.mkdir()
    for table in (tmp_path / "sorted").iterdir():
        lines = table.read_text().splitlines()
        (shuffled / table.name).write_text("\n".join(lines[::-1]) + "\n")
    assert list(iter_data_dir(shuffled)) == streamed
    (shuffled / "utt2dur").write_text("".join(line + "\n" for line in (shuffled / "utt2dur").read_text().split("\n")[1:]
                                              if line))
    with pytest.raises(DataDirError, match="s2-11 is missing from utt2spk, utt2dur or utt2sr"):
        list(iter_data_dir(shuffled))


def test_sorted_tables_join_and_merge_a_line_at_a_time(tmp_path: Path) -> None:
    import pytest

    from asrflow.data.tables import Unsorted, drain, lookup, ordered_rows, sorted_rows

    (tmp_path / "a").write_text("a 1\nc 3 with spaces\nd 4\n")
    (tmp_path / "b").write_text("c 3\na 1\n")
    find = lookup(sorted_rows(tmp_path / "a"))
    assert [find(k) for k in ("a", "b", "c", "e")] == ["1", None, "3 with spaces", None]
    with pytest.raises(Unsorted):
        drain(sorted_rows(tmp_path / "b"))
    assert list(ordered_rows(tmp_path / "b")) == [("a", "1"), ("c", "3")]
    assert list(ordered_rows(tmp_path / "a"))[1] == ("c", "3 with spaces")


def test_the_external_sort_merges_its_runs_stably(tmp_path: Path) -> None:
    """Past its buffer the sort spills sorted runs and merges them; equal keys keep the order they came in, and
    the runs are gone once read."""
    from asrflow.data.tables import ExternalSort

    sort = ExternalSort(tmp_path / "runs", buffer=3)
    keys = ["d", "b", "a", "c", "b", "e", "a"]
    for i, key in enumerate(keys):
        sort.add(key, f"{key}{i} with spaces")
    assert len(sort.runs) == 2
    assert list(sort.merged()) == [("a", "a2 with spaces"), ("a", "a6 with spaces"), ("b", "b1 with spaces"),
                                   ("b", "b4 with spaces"), ("c", "c3 with spaces"), ("d", "d0 with spaces"),
                                   ("e", "e5 with spaces")]
    assert not list((tmp_path / "runs").iterdir())


def test_a_writer_needs_increasing_ids_and_leaves_nothing_half_written(tmp_path: Path) -> None:
    import pytest

    from asrflow.data.datadir import DataDirWriter

    with pytest.raises(ValueError, match="ids must increase"), DataDirWriter(tmp_path / "d") as writer:
        writer.add(Utterance("b", "s", "/b.wav", "x", 1.0, 8000, "b"))
        writer.add(Utterance("a", "s", "/a.wav", "y", 1.0, 8000, "a"))
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == []
