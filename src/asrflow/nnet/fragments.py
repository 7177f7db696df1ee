"""Edge-fragment augmentation: pieces of words put at training utterances' edges, to be read as silence.

Recordings cut out of a longer session often begin inside the tail of the word before them
or end on the onset of the word after, and their transcripts name neither fragment (the
Kaldi yes/no test file ``1_1_1_1_0_1_0_0`` opens with 270 ms of a "ken" without its /k/). A
network trained only on utterances that start and end in clean silence reads such a piece
as its word's phones, and the decoder then outputs a whole word for it. This augmentation
shows the network such pieces as what the transcripts make them, silence: with probability
``probability`` per training utterance and epoch, the last 5 to ``max_frames`` frames of a
word (cut at the end of a word of a training utterance of the same speaker, from the
GMM alignment) are put before the utterance, and independently, the first frames of a word
after it. For a hybrid the added frames take the utterance's own first (last) frame label,
a state of the silence phone; a CTC model's label sequence stays as it is (the fragment is
blank). Only utterances whose alignment begins (ends) in silence are extended on that side.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from asrflow.data.datadir import read_table
from asrflow.lang.graph import read_symbols
from asrflow.nnet import NnetError

MIN_FRAMES = 5


def speech_frames(phones: dict[str, list[str]], silence: set[str]) -> dict[str, np.ndarray]:
    """Per utterance, whether each frame of its alignment lies inside a word (its phone is not silence)."""
    return {utt: np.asarray([p not in silence for p in seq], dtype=bool) for utt, seq in phones.items()}


def alignment_speech(ali_dir: str | Path | None, lang_dir: str | Path | None, source: str = "--gmm"
                     ) -> dict[str, np.ndarray]:
    """:func:`speech_frames` of the frame phones in ``ali_dir/ali/phones.txt`` (a GMM or align stage folder,
    given as the option ``source``), with the silence phones of ``lang_dir``."""
    lang = Path(lang_dir) if lang_dir is not None else None
    if lang is None or not (lang / "silence.int").is_file():
        raise NnetError(f"edge fragments need the lang folder (--lang) for its silence phones (got {lang_dir})")
    ali = Path(ali_dir) / "ali" / "phones.txt" if ali_dir is not None else None
    if ali is None or not ali.is_file():
        raise NnetError(f"edge fragments are cut from frame alignments: {source} must be a folder with "
                        f"ali/phones.txt covering these utterances (got {ali_dir})")
    symbols = {i: p for p, i in read_symbols(lang / "phones.txt").items()}
    silence = {symbols[int(i)] for i in (lang / "silence.int").read_text().split()}
    return speech_frames({utt: seq.split() for utt, seq in read_table(ali).items()}, silence)


def word_spans(speech: np.ndarray) -> list[tuple[int, int]]:
    """``(start, end)`` frame ranges of the runs of speech frames (a word, or words without a pause)."""
    edges = np.flatnonzero(np.diff(np.concatenate([[0], speech.astype(np.int8), [0]])))
    return [(int(a), int(b)) for a, b in zip(edges[::2], edges[1::2])]


class EdgeFragments:
    """Adds word fragments to the edges of training utterances (module docstring).

    ``utterances`` are ``(utterance, speaker)`` per dataset index, ``speech`` the per-frame
    word masks of :func:`speech_frames`. Donors are the utterances of the same speaker (all
    utterances when a speaker has one).
    """

    def __init__(self, utterances: list[tuple[str, str]], speech: dict[str, np.ndarray], probability: float,
                 max_frames: int, frame_targets: bool = True) -> None:
        self.probability, self.max_frames = probability, max(max_frames, MIN_FRAMES)
        self.frame_targets = frame_targets
        self.speech = speech
        self.spans = {utt: word_spans(speech[utt]) for utt, _ in utterances if utt in speech}
        by_speaker: dict[str, list[int]] = defaultdict(list)
        for index, (utt, spk) in enumerate(utterances):
            if self.spans.get(utt):
                by_speaker[spk].append(index)
        everyone = [i for ids in by_speaker.values() for i in ids]
        self.donors = {spk: ids if len(ids) > 1 else everyone for spk, ids in by_speaker.items()}
        self.speaker = dict(utterances)

    def _piece(self, dataset, utt: str, rng: np.random.Generator, tail: bool) -> torch.Tensor | None:
        """Features of the end (``tail``) or the start of a random word of a donor utterance."""
        donors = self.donors.get(self.speaker[utt]) or []
        if not donors:
            return None
        name, feats, _ = dataset[int(donors[rng.integers(len(donors))])]
        spans = self.spans[name]
        start, end = spans[rng.integers(len(spans))]
        length = min(int(rng.integers(MIN_FRAMES, self.max_frames + 1)), end - start)
        return feats[end - length:end] if tail else feats[start:start + length]

    def pieces(self, dataset, utt: str, rng: np.random.Generator) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The fragments drawn for ``utt``'s start and end (None: that edge stays as it is)."""
        speech = self.speech.get(utt)
        before = rng.random() < self.probability
        after = rng.random() < self.probability
        if speech is None or not len(speech):
            return None, None
        head = self._piece(dataset, utt, rng, tail=True) if before and not speech[0] else None
        tail = self._piece(dataset, utt, rng, tail=False) if after and not speech[-1] else None
        return head, tail

    def apply(self, dataset, item: tuple[str, torch.Tensor, torch.Tensor], rng: np.random.Generator
              ) -> tuple[str, torch.Tensor, torch.Tensor]:
        """``item`` (utterance, features, targets) with fragments added at either edge, or as it was.

        Frame targets get the edge frame's label for each added frame; a label sequence (CTC) is kept.
        """
        utt, feats, target = item
        head, tail = self.pieces(dataset, utt, rng)
        if head is None and tail is None:
            return item
        parts, labels = [feats], [target]
        if head is not None:
            parts.insert(0, head)
            labels.insert(0, target[:1].expand(len(head)))
        if tail is not None:
            parts.append(tail)
            labels.append(target[-1:].expand(len(tail)))
        return utt, torch.cat(parts), torch.cat(labels) if self.frame_targets else target
