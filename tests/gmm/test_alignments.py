"""Alignment archives: per-shard archives written by tasks, read back by reference or through Kaldi's scp."""

import pickle
from pathlib import Path

import kaldiio
import numpy as np
import pytest

from asrflow.gmm.alignments import (
    StoredAlignments,
    Written,
    archive_index,
    load_alignment,
    read_alignments,
    references,
    shard_alignments,
    write_alignments,
    write_archive,
)


def test_a_shard_archive_is_read_back_by_its_references(tmp_path: Path) -> None:
    vectors = {"u2": np.array([5, 6, 7], dtype=np.int32), "u1": np.arange(40, dtype=np.int64)}
    refs = write_archive(tmp_path / "ali.1" / "shard.ark", vectors)
    assert sorted(refs) == ["u1", "u2"]
    assert all(ref.startswith(f"{tmp_path / 'ali.1' / 'shard.ark'}:") for ref in refs.values())
    for utt, ref in refs.items():
        # a Kaldi rxfilename: kaldiio (as Kaldi's tools) reads it as an int32 vector
        np.testing.assert_array_equal(kaldiio.load_mat(ref), vectors[utt])
        assert load_alignment(ref).dtype == np.int32
    assert sorted(p.name for p in (tmp_path / "ali.1").iterdir()) == ["shard.ark", "shard.scp"]  # no temporary file
    assert dict(kaldiio.load_scp(str(archive_index(tmp_path / "ali.1" / "shard.ark"))))["u2"].tolist() == [5, 6, 7]
    stored = StoredAlignments(refs)
    assert len(stored) == 2 and "u1" in stored and "u3" not in stored
    np.testing.assert_array_equal(stored["u2"], [5, 6, 7])
    assert stored.refs == refs and stored.ref("u1") == refs["u1"]  # one integer each, the same references
    more = write_archive(tmp_path / "ali.2" / "shard.ark", {"u3": np.arange(2)})
    stored.update(more)
    stored.update({"u1": more["u3"]})  # a newer alignment replaces the older
    assert stored.refs == {"u1": more["u3"], "u2": refs["u2"], "u3": more["u3"]}


def test_tasks_get_references_of_stored_alignments_and_vectors_of_others(tmp_path: Path) -> None:
    refs = write_archive(tmp_path / "a.ark", {"u1": np.arange(3), "u2": np.arange(4)})
    given = shard_alignments(StoredAlignments(refs), ["u2", "u9"])
    assert list(given) == ["u2"] and given.refs == {"u2": refs["u2"]}  # references, not vectors
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(given))["u2"], np.arange(4))  # read by the task
    plain = {"u1": np.arange(3)}
    assert shard_alignments(plain, ["u1", "u2"]).keys() == {"u1"}
    np.testing.assert_array_equal(load_alignment(shard_alignments(plain, ["u1"])["u1"]), np.arange(3))


def test_an_alignment_folder_is_written_from_references_and_read_lazily(tmp_path: Path) -> None:
    refs = write_archive(tmp_path / "parts" / "0.ark", {"b": np.array([1, 2, 2]), "a": np.array([3, 3])})
    tid2pdf, tid2phone = np.array([0, 10, 20, 30]), np.array([0, 1, 1, 2])
    write_alignments(tmp_path / "ali", tid2pdf, tid2phone, StoredAlignments(refs))
    tids = read_alignments(tmp_path / "ali")
    assert list(tids) == ["a", "b"]  # sorted, as Kaldi's archives
    np.testing.assert_array_equal(read_alignments(tmp_path / "ali", "pdfs")["b"], [10, 20, 20])
    np.testing.assert_array_equal(read_alignments(tmp_path / "ali", "phones")["a"], [2, 2])
    assert dict(kaldiio.load_scp(str(tmp_path / "ali" / "transition_ids.scp")))["b"].tolist() == [1, 2, 2]


def test_written_archives_add_up_to_their_indexes_and_give_every_reference(tmp_path: Path) -> None:
    """What a reduction carries of written alignments is the archives' indexes in shard order, however many
    utterances they hold; the driver reads the references from them."""
    first = write_archive(tmp_path / "0.ark", {"u1": np.arange(3), "u2": np.arange(4)})
    second = write_archive(tmp_path / "1.ark", {"u3": np.arange(2)})
    written = Written((str(archive_index(tmp_path / "0.ark")),)) + Written((str(archive_index(tmp_path / "1.ark")),))
    assert written.indexes == (str(tmp_path / "0.scp"), str(tmp_path / "1.scp"))
    assert references(written) == {**first, **second} == dict(written.entries())
    stored = StoredAlignments(written)
    assert stored.refs == {**first, **second}
    np.testing.assert_array_equal(stored["u3"], [0, 1])
    assert Written() + written == written
    assert len(pickle.dumps(written)) < 100 + sum(map(len, written.indexes))  # the paths, nothing per utterance


def test_int32_vectors_are_kaldis_encoding_byte_for_byte(tmp_path: Path) -> None:
    """The vector codec against kaldiio's (Kaldi's ``WriteIntegerVector``): same bytes, same values back, empty and
    negative vectors included; a damaged vector is an error naming where it is."""
    import io

    from asrflow.gmm.alignments import read_vector, vector_bytes

    rng = np.random.default_rng(3)
    for vector in (np.array([], dtype=np.int32), np.array([-7, 0, 2**31 - 1]), rng.integers(0, 5000, 977)):
        reference = io.BytesIO()
        kaldiio.save_mat(reference, np.asarray(vector, dtype=np.int32))
        assert vector_bytes(vector) == reference.getvalue()
        back = read_vector(io.BytesIO(vector_bytes(vector)))
        assert back.dtype == np.int32 and back.tolist() == list(vector)
    with pytest.raises(ValueError, match="a.ark:9: a truncated"):
        read_vector(io.BytesIO(vector_bytes(np.arange(4))[:-3]), "a.ark:9")
    with pytest.raises(ValueError, match="not a Kaldi binary int32 vector"):
        read_vector(io.BytesIO(b"\0BFM "), "b.ark:0")
