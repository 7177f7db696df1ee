import random

import jiwer
import pytest

from asrflow.score import align_words, score_corpus
from asrflow.score.wer import format_alignment


def test_counts_match_jiwer_on_random_pairs() -> None:
    rng = random.Random(0)
    words = ["yes", "no", "one", "two", "three"]
    refs, hyps = {}, {}
    for i in range(300):
        refs[f"u{i:03d}"] = " ".join(rng.choice(words) for _ in range(rng.randint(1, 8)))
        hyps[f"u{i:03d}"] = " ".join(rng.choice(words) for _ in range(rng.randint(0, 9)))
    summary, _ = score_corpus(refs, hyps)
    keys = sorted(refs)
    out = jiwer.process_words([refs[k] for k in keys], [hyps[k] or "" for k in keys])
    # Equal-cost alignments may split edits differently (kaldialign vs jiwer tie-breaking):
    # the total, WER and ins - del (= hyp words - ref words) must agree.
    ours = summary["sub"] + summary["del"] + summary["ins"]
    assert ours == out.substitutions + out.deletions + out.insertions
    assert summary["ins"] - summary["del"] == out.insertions - out.deletions
    assert summary["wer"] == pytest.approx(out.wer)
    assert summary["n_ref_words"] == sum(len(refs[k].split()) for k in keys)


def test_ser_speakers_oov_and_missing_hypothesis() -> None:
    refs = {"a-1": "yes no", "a-2": "no", "b-1": "hello there"}
    hyps = {"a-1": "yes no", "a-2": "yes"}
    summary, scores = score_corpus(refs, hyps, utt2spk={"a-1": "a", "a-2": "a", "b-1": "b"},
                                   vocabulary={"yes", "no", "hello"}, rtf=0.01)
    assert summary["ser"] == pytest.approx(2 / 3)
    assert summary["del"] == 2 and summary["sub"] == 1 and summary["wer"] == pytest.approx(3 / 5)
    assert summary["oov_rate"] == pytest.approx(1 / 5)
    assert summary["wer_in_vocabulary"] == pytest.approx(1 / 3)
    assert summary["per_speaker"]["b"]["wer"] == 1.0
    assert summary["rtf"] == 0.01
    assert "#csid 0 0 0 2" in format_alignment(scores[2])


def test_csid_counts_correct_words_beside_an_insertion() -> None:
    """Kaldi's #csid line: correct, substituted, inserted, deleted (an insertion is not a correct word)."""
    score = align_words(["yes", "yes", "no"], ["yes", "yes", "yes", "no"])
    assert format_alignment(score).splitlines()[-1].split()[-5:] == ["#csid", "3", "0", "1", "0"]


def test_insertions_only() -> None:
    score = align_words([], ["uh"])
    assert score.counts.ins == 1 and score.counts.wer == 1.0
