"""The tree and alignments of chain models: tied states at a reduced frame rate.

Kaldi's chain models (LF-MMI networks) output one frame in every ``k`` (``k`` = 3: 30 ms) and
model each phone with one HMM state whose first frame and later frames have pdfs of their own
(:func:`~asrflow.lang.symbols.chain_topology_text`), so a phone may last a single output frame.
Their tree is built anew, from a GMM's alignments at the reduced rate
(``steps/nnet3/chain/build_tree.sh``):

1. **Subsampling** (:func:`subsample`): output frame ``j`` stands for source frame ``phase + k·j``;
   each phone of the source alignment keeps the output frames that fall inside it, the first of them
   with pdf class 0 and the rest with pdf class 1. The GMMs' phones last at least 3 frames (3 states,
   silence 5), so at ``k`` = 3 every phone keeps at least one frame whatever the phase; an alignment
   whose phone would vanish is reported, not converted.
2. **Tree statistics** on the kept frames' features, and the tree built as the GMM's are
   (:func:`asrflow.gmm.train.tree_from_stats`), with two pdf classes per phone.
3. **Conversion** (:class:`ChainAlignments`, ``convert-ali --frame-subsampling-factor``): every
   source alignment rewritten as the chain model's transition ids at the reduced rate, the pdfs from
   the new tree for each phone's left and right neighbours. The transition ids follow the decoding
   graph's reordered HMMs: a phone's first frame takes the forward transition, the later ones the
   self-loop.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from asrflow.gmm.model import GmmModel
from asrflow.gmm.tree import TreeStats, accumulate_tree_stats


@dataclass(frozen=True)
class Subsampled:
    """One utterance's alignment at the reduced frame rate."""

    frames: np.ndarray  # (J,) the source frame each output frame stands for
    phones: np.ndarray  # (J,) its phone
    pdf_classes: np.ndarray  # (J,) 0 on a phone's first output frame, 1 on the others
    segments: np.ndarray  # (J,) the phone instance (0, 1, …) it belongs to


def phone_starts(phones: np.ndarray, states: np.ndarray) -> np.ndarray:
    """Whether each frame of a GMM alignment (its frames' phones and HMM states) starts a phone: HMM state 0
    after another state or another phone. Two instances of one phone in a row stay apart, since every
    topology here leaves state 0 for good once it moves on."""
    phones, states = np.asarray(phones), np.asarray(states)
    start = states == 0
    start[1:] &= (states[:-1] != 0) | (phones[:-1] != phones[1:])
    if len(start):
        start[0] = True
    return start


def subsample(phones: np.ndarray, states: np.ndarray, factor: int, phase: int = 0) -> Subsampled | None:
    """A GMM alignment (per-frame phones and HMM states) at one frame in ``factor``, from frame ``phase``;
    None when a phone keeps no frame (it is shorter than ``factor`` frames and falls between two)."""
    if not 0 <= phase < factor:
        raise ValueError(f"phase {phase} must be in [0, {factor})")
    starts = phone_starts(phones, states)
    segment_of = np.cumsum(starts) - 1
    frames = np.arange(phase, len(starts), factor)
    segments = segment_of[frames]
    if len(np.unique(segments)) != int(starts.sum()):
        return None
    first = np.ones(len(segments), dtype=bool)
    first[1:] = segments[1:] != segments[:-1]
    return Subsampled(frames, np.asarray(phones)[frames], np.where(first, 0, 1), segments)


def chain_tree_stats(feats: np.ndarray, phones: np.ndarray, states: np.ndarray, factor: int) -> TreeStats | None:
    """Tree statistics of one utterance at the reduced rate (``acc-tree-stats`` on the subsampled alignment and
    features); None when its alignment cannot be subsampled."""
    sub = subsample(phones, states, factor)
    if sub is None:
        return None
    return accumulate_tree_stats(feats[sub.frames], sub.phones, sub.pdf_classes)


class ChainAlignments:
    """Converts a GMM's alignments into a chain model's transition ids at ``factor`` times fewer frames."""

    def __init__(self, source: GmmModel, chain: GmmModel, factor: int) -> None:
        self.source_phone, self.source_state = source.tid_tables
        self.tree, self.factor = chain.tree, factor
        table = chain.transition_states
        self.state_of = {(int(p), int(f), int(s)): i + 1 for i, (p, _, f, s) in enumerate(table)}
        self.first_tid = np.asarray(chain.tm.state2id, dtype=np.int64)
        self.self_loop = chain.self_loops
        self._pdfs: dict[tuple[int, int, int], tuple[int, int]] = {}

    def pdfs(self, left: int, phone: int, right: int) -> tuple[int, int]:
        """The forward and self-loop pdfs of ``phone`` between ``left`` and ``right`` (0: the utterance's edge)."""
        key = (left, phone, right)
        if key not in self._pdfs:
            first = 1 - self.tree.central_position  # the tree's window of (left, phone, right)
            window = [left, phone, right][first: first + self.tree.context_width]
            found = [self.tree.compute(window, c) for c in (0, 1)]
            if not all(ok for ok, _ in found):
                raise ValueError(f"the chain tree has no pdf for phone {phone} between {left} and {right}")
            self._pdfs[key] = (found[0][1], found[1][1])
        return self._pdfs[key]

    def transition_ids(self, phone: int, forward: int, self_pdf: int) -> tuple[int, int]:
        """The forward and self-loop transition ids of ``phone``'s state with these pdfs."""
        state = self.state_of[(phone, forward, self_pdf)]
        tids = range(int(self.first_tid[state]), int(self.first_tid[state + 1]))
        return (next(t for t in tids if not self.self_loop[t]), next(t for t in tids if self.self_loop[t]))

    def convert(self, alignment: np.ndarray, phase: int = 0) -> np.ndarray | None:
        """The chain transition ids of one source alignment (transition ids), None when a phone is too short."""
        alignment = np.asarray(alignment)
        sub = subsample(self.source_phone[alignment], self.source_state[alignment], self.factor, phase)
        if sub is None:
            return None
        first = np.flatnonzero(sub.pdf_classes == 0)
        phones = sub.phones[first]
        left = np.concatenate([[0], phones[:-1]])
        right = np.concatenate([phones[1:], [0]])
        forward_tid, loop_tid = np.zeros(len(phones), dtype=np.int64), np.zeros(len(phones), dtype=np.int64)
        for i, (a, p, b) in enumerate(zip(left.tolist(), phones.tolist(), right.tolist())):
            forward_tid[i], loop_tid[i] = self.transition_ids(p, *self.pdfs(a, p, b))
        return np.where(sub.pdf_classes == 0, forward_tid[sub.segments], loop_tid[sub.segments]).astype(np.int32)
