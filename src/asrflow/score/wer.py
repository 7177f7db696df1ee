"""Word error rate by Levenshtein alignment (kaldialign), with the counts Kaldi reports.

``score_corpus`` returns the summary written to ``results/<exp>/score/<system>/<set>.json``:
``wer``, ``ser`` and ``oov_rate`` as fractions, ``sub``/``del``/``ins`` counts,
``n_ref_words``, ``n_utts``, ``rtf`` (when given), the WER over the utterances whose
reference is fully in the vocabulary (``wer_in_vocabulary``), and per-speaker WERs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import kaldialign

EPS = "*"


@dataclass
class ErrorCounts:
    """Edit counts of one utterance or a set of utterances."""

    sub: int = 0
    dele: int = 0
    ins: int = 0
    ref_words: int = 0
    utts: int = 0
    utts_wrong: int = 0

    def add(self, other: ErrorCounts) -> None:
        self.sub += other.sub
        self.dele += other.dele
        self.ins += other.ins
        self.ref_words += other.ref_words
        self.utts += other.utts
        self.utts_wrong += other.utts_wrong

    @property
    def errors(self) -> int:
        return self.sub + self.dele + self.ins

    @property
    def wer(self) -> float:
        """Errors over reference words (an empty reference with insertions counts them all)."""
        if self.ref_words:
            return self.errors / self.ref_words
        return float(self.errors > 0)

    @property
    def ser(self) -> float:
        return self.utts_wrong / self.utts if self.utts else 0.0


@dataclass
class UtteranceScore:
    """One utterance's alignment: (ref, hyp) word pairs with ``*`` for a gap."""

    utt_id: str
    pairs: list[tuple[str, str]]
    counts: ErrorCounts = field(default_factory=ErrorCounts)


def align_words(ref: list[str], hyp: list[str], utt_id: str = "") -> UtteranceScore:
    """Align reference and hypothesis words; count substitutions, deletions, insertions."""
    pairs = kaldialign.align(ref, hyp, EPS) if (ref or hyp) else []
    counts = ErrorCounts(ref_words=len(ref), utts=1)
    for r, h in pairs:
        if r == EPS:
            counts.ins += 1
        elif h == EPS:
            counts.dele += 1
        elif r != h:
            counts.sub += 1
    counts.utts_wrong = int(counts.errors > 0)
    return UtteranceScore(utt_id, pairs, counts)


def score_corpus(
    refs: Mapping[str, str],
    hyps: Mapping[str, str],
    utt2spk: Mapping[str, str] | None = None,
    vocabulary: set[str] | None = None,
    rtf: float | None = None,
) -> tuple[dict, list[UtteranceScore]]:
    """Score every reference utterance (a missing hypothesis counts as empty).

    Returns the summary dict and the per-utterance alignments.
    """
    total, in_vocab = ErrorCounts(), ErrorCounts()
    per_speaker: dict[str, ErrorCounts] = {}
    scores = []
    oov = tokens = 0
    for utt in sorted(refs):
        ref = refs[utt].split()
        score = align_words(ref, hyps.get(utt, "").split(), utt)
        scores.append(score)
        total.add(score.counts)
        if utt2spk is not None:
            per_speaker.setdefault(utt2spk.get(utt, "?"), ErrorCounts()).add(score.counts)
        if vocabulary is not None:
            n_oov = sum(1 for w in ref if w not in vocabulary)
            oov += n_oov
            tokens += len(ref)
            if n_oov == 0:
                in_vocab.add(score.counts)
    summary = {
        "wer": total.wer, "ser": total.ser, "sub": total.sub, "del": total.dele, "ins": total.ins,
        "n_ref_words": total.ref_words, "n_utts": total.utts,
        "oov_rate": (oov / tokens) if tokens else 0.0, "rtf": rtf,
        "errors": total.errors, "accuracy": 1.0 - total.wer,
    }
    if vocabulary is not None:
        summary["wer_in_vocabulary"] = in_vocab.wer
        summary["n_utts_in_vocabulary"] = in_vocab.utts
    if per_speaker:
        summary["per_speaker"] = {s: {"wer": c.wer, "ser": c.ser, "n_ref_words": c.ref_words, "n_utts": c.utts}
                                  for s, c in sorted(per_speaker.items())}
    return summary, scores


def group_summaries(scores: list[UtteranceScore], group_of: Mapping[str, str]) -> dict[str, dict[str, float]]:
    """WER, SER and word and utterance counts per group (``group_of``: utterance → group; others left out)."""
    counts: dict[str, ErrorCounts] = {}
    for score in scores:
        if (group := group_of.get(score.utt_id)) is not None:
            counts.setdefault(group, ErrorCounts()).add(score.counts)
    return {g: {"wer": c.wer, "ser": c.ser, "errors": c.errors, "n_ref_words": c.ref_words, "n_utts": c.utts}
            for g, c in sorted(counts.items())}


def format_alignment(score: UtteranceScore) -> str:
    """Kaldi-style ``ref``/``hyp``/``op`` lines for one utterance."""
    ops = []
    for r, h in score.pairs:
        ops.append("I" if r == EPS else "D" if h == EPS else "C" if r == h else "S")
    width = [max(len(r), len(h), 1) for r, h in score.pairs]
    line = lambda items: " ".join(x.ljust(w) for x, w in zip(items, width))  # noqa: E731
    return "\n".join([
        f"{score.utt_id} ref  {line([r for r, _ in score.pairs])}",
        f"{score.utt_id} hyp  {line([h for _, h in score.pairs])}",
        f"{score.utt_id} op   {line(ops)}",
        f"{score.utt_id} #csid {len(ops) - score.counts.errors} {score.counts.sub} "
        f"{score.counts.ins} {score.counts.dele}",
    ])
