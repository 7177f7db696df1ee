"""Edge-fragment augmentation: word spans from alignments, fragments added as silence, reproducibly."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from asrflow.nnet import NnetError
from asrflow.nnet.fragments import (MIN_FRAMES, EdgeFragments, filler_phone, own_pdf, speech_frames,
                                   word_spans)

SIL = 0  # the silence pdf of these alignments


class Utterances:
    """A stand-in for FeatureDataset: ``items`` of (utt, value, speaker, frames) and (utt, feats, target) by index.

    Feature frame t of utterance k holds 100 * k + t, so a fragment tells where it was cut from.
    """

    def __init__(self, phones: dict[str, list[str]], speakers: dict[str, str]) -> None:
        self.phones = phones
        self.items = [(utt, "", speakers[utt], len(seq)) for utt, seq in sorted(phones.items())]

    def __getitem__(self, index: int) -> tuple[str, torch.Tensor, torch.Tensor]:
        utt, _, _, frames = self.items[index]
        feats = (100.0 * index + torch.arange(frames, dtype=torch.float32)).unsqueeze(1).expand(frames, 3)
        target = torch.tensor([SIL if p == "SIL" else 7 for p in self.phones[utt]])
        return utt, feats.clone(), target


def alignments() -> dict[str, list[str]]:
    return {"a": ["SIL"] * 4 + ["y"] * 10 + ["SIL"] * 3 + ["n"] * 8 + ["SIL"] * 4,
            "b": ["SIL"] * 5 + ["n"] * 12 + ["SIL"] * 5,
            "c": ["y"] * 9 + ["SIL"] * 6}  # starts inside a word


def test_word_spans_are_the_runs_of_speech_frames() -> None:
    speech = speech_frames(alignments(), {"SIL", "SPN"})
    assert word_spans(speech["a"]) == [(4, 14), (17, 25)]
    assert word_spans(speech["c"]) == [(0, 9)]
    assert word_spans(np.zeros(5, dtype=bool)) == []


def test_fragments_are_word_pieces_labelled_as_the_edge_silence() -> None:
    phones = alignments()
    data = Utterances(phones, {"a": "s1", "b": "s1", "c": "s1"})
    speech = speech_frames(phones, {"SIL"})
    fragments = EdgeFragments([(u, s) for u, _, s, _ in data.items], speech, 1.0, 8)
    utt, feats, target = data[1]  # "b": begins and ends in silence
    out_utt, out_feats, out_target = fragments.apply(data, (utt, feats, target), np.random.default_rng(0))
    before = int((out_feats[:, 0] == feats[0, 0]).nonzero()[0])  # where b's own frames start
    after = len(out_feats) - before - len(feats)
    assert out_utt == "b" and len(out_target) == len(out_feats)
    assert MIN_FRAMES <= before <= 8 and MIN_FRAMES <= after <= 8
    assert torch.equal(out_feats[before:before + len(feats)], feats)
    assert torch.equal(out_target[before:before + len(feats)], target)
    assert (out_target[:before] == SIL).all() and (out_target[-after:] == SIL).all()

    def source(piece: torch.Tensor) -> tuple[list[tuple[int, int]], int, int]:
        """The word spans of the utterance a piece was cut from, and the piece's first and end frame there."""
        index, first = divmod(int(piece[0, 0]), 100)
        assert torch.equal(piece[:, 0], 100.0 * index + torch.arange(first, first + len(piece)))  # contiguous
        return word_spans(speech[data.items[index][0]]), first, first + len(piece)

    spans, first, end = source(out_feats[:before])  # the end of a word
    assert any(start <= first and end == stop for start, stop in spans)
    spans, first, end = source(out_feats[-after:])  # the start of a word
    assert any(first == start and end <= stop for start, stop in spans)


def test_fragments_are_reproducible_and_skip_edges_inside_words() -> None:
    phones = alignments()
    data = Utterances(phones, {"a": "s1", "b": "s1", "c": "s2"})
    fragments = EdgeFragments([(u, s) for u, _, s, _ in data.items], speech_frames(phones, {"SIL"}), 1.0, 30)
    first = fragments.apply(data, data[0], np.random.default_rng([3, 1]))
    again = fragments.apply(data, data[0], np.random.default_rng([3, 1]))
    assert torch.equal(first[1], again[1]) and torch.equal(first[2], again[2])
    _, feats, target = fragments.apply(data, data[2], np.random.default_rng(0))  # "c" starts inside a word
    assert torch.equal(feats[:9], data[2][1][:9]) and len(feats) > 15  # only its end was extended
    off = EdgeFragments([(u, s) for u, _, s, _ in data.items], speech_frames(phones, {"SIL"}), 0.0, 30)
    assert torch.equal(off.apply(data, data[1], np.random.default_rng(0))[1], data[1][1])


def test_training_batches_carry_the_fragments_reproducibly() -> None:
    """The trainer's batches pass through the dataset's fragments, drawn from seed, epoch, step and rank."""
    from asrflow.nnet.train import TrainOptions, _make_batch

    phones = alignments()
    data = Utterances(phones, {"a": "s1", "b": "s1", "c": "s1"})
    data.fragments = None
    opts = TrainOptions(seed=3)
    plain = _make_batch(data, [[0, 1]], opts, "hybrid", 0, 0, 0)
    data.fragments = EdgeFragments([(u, s) for u, _, s, _ in data.items], speech_frames(phones, {"SIL"}), 1.0, 30)
    batch, again = (_make_batch(data, [[0, 1]], opts, "hybrid", 0, 0, 0) for _ in range(2))
    other_epoch = _make_batch(data, [[0, 1]], opts, "hybrid", 1, 0, 0)
    assert (batch["lengths"] > plain["lengths"]).all()
    assert torch.equal(batch["feats"], again["feats"]) and torch.equal(batch["targets"], again["targets"])
    assert not torch.equal(batch["lengths"], other_epoch["lengths"]) or not torch.equal(batch["feats"],
                                                                                       other_epoch["feats"])


def test_a_label_sequence_is_kept_when_fragments_are_added() -> None:
    """CTC: the fragment frames get no label (the network is to write blank there)."""
    phones = alignments()
    data = Utterances(phones, {"a": "s1", "b": "s1", "c": "s1"})
    fragments = EdgeFragments([(u, s) for u, _, s, _ in data.items], speech_frames(phones, {"SIL"}), 1.0, 30,
                              frame_targets=False)
    utt, feats, _ = data[1]
    labels = torch.tensor([4, 2])
    out = fragments.apply(data, (utt, feats, labels), np.random.default_rng(0))
    assert len(out[1]) > len(feats) and torch.equal(out[2], labels)


def test_filler_label_marks_every_fragment_frame() -> None:
    """label: the fragment frames get the filler pdf, the utterance's own frames keep theirs."""
    phones = alignments()
    data = Utterances(phones, {"a": "s1", "b": "s1", "c": "s1"})
    fragments = EdgeFragments([(u, s) for u, _, s, _ in data.items], speech_frames(phones, {"SIL"}), 1.0, 8,
                              label=3)
    utt, feats, target = data[1]
    _, out_feats, out_target = fragments.apply(data, (utt, feats, target), np.random.default_rng(0))
    before = int((out_feats[:, 0] == feats[0, 0]).nonzero()[0])
    after = len(out_feats) - before - len(feats)
    assert before >= MIN_FRAMES and after >= MIN_FRAMES
    assert (out_target[:before] == 3).all() and (out_target[-after:] == 3).all()
    assert torch.equal(out_target[before:before + len(feats)], target)


def test_expected_fragment_frames_match_the_draws() -> None:
    """The priors' count of fragment frames (per class, one epoch) is what the augmentation adds on average."""
    phones = alignments()
    data = Utterances(phones, {"a": "s1", "b": "s1", "c": "s1"})
    speech = speech_frames(phones, {"SIL"})
    targets = {u: data[i][2].numpy() for i, (u, *_) in enumerate(data.items)}
    for label, probability in ((None, 1.0), (3, 0.5)):
        fragments = EdgeFragments([(u, s) for u, _, s, _ in data.items], speech, probability, 12, label=label)
        expected = fragments.expected_frames(targets, 10)
        assert expected.nonzero()[0].tolist() == [SIL if label is None else label]  # word classes get nothing
        rng, added = np.random.default_rng(0), 0
        for _ in range(2000):
            for i in range(len(data.items)):
                added += len(fragments.apply(data, data[i], rng)[2]) - len(data[i][2])
        assert abs(added / 2000 - expected.sum()) < 0.03 * expected.sum(), (added / 2000, expected.sum())


def test_the_filler_is_the_oov_words_phone_with_a_pdf_of_its_own(tmp_path: Path) -> None:
    (tmp_path / "oov.txt").write_text("<unk>\n")
    (tmp_path / "lexicon.txt").write_text("<SIL> SIL\n<unk> SPN\nyes y e s\n")
    (tmp_path / "phones.txt").write_text("<eps> 0\nSIL 1\nSPN 2\ny 3\ne 4\ns 5\n")
    assert filler_phone(tmp_path) == ("SPN", 2)
    assert own_pdf({1: {0, 1}, 2: {6}, 3: {7, 8}}, 2) == 6
    with pytest.raises(NnetError, match="shared with other phones: \\[6\\]"):
        own_pdf({1: {0, 6}, 2: {6}}, 2)
    with pytest.raises(NnetError, match="has pdfs \\[5, 6\\]"):
        own_pdf({1: {0}, 2: {5, 6}}, 2)
    (tmp_path / "lexicon.txt").write_text("<SIL> SIL\n<unk> S P N\n")
    with pytest.raises(NnetError, match="must have one pronunciation of one phone"):
        filler_phone(tmp_path)
