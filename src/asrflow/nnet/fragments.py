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
a state of the silence phone, or with ``label: filler`` the pdf of the lang's filler phone (SPN,
the OOV word's pronunciation; :func:`filler_pdf`; where every training word is in the lexicon,
no other frame has it, as in Kaldi, spoken noise and OOV words share it otherwise): the
priors then count the fragment frames (:meth:`EdgeFragments.expected_frames`) and the decoding
graph admits the filler once before and once after the sentence
(:func:`asrflow.lang.graph.add_edge_filler`), so a piece of a word at a file's edge is read as
the filler, not as a word. A CTC model's label sequence stays as it is (the fragment is
blank). Only utterances whose alignment begins (ends) in silence are extended on that side.

Why a filler of its own: the decoder scores a frame by log posterior minus log prior, and the
edge silence state is the commonest pdf (23 % of yesno's frames), so a fragment posterior that
training raises to 0.3 still scores below a word state's; a silence pdf with a small prior,
reachable wherever silence is, swallowed words instead (docs/nnet.md).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

from asrflow.data.datadir import read_table
from asrflow.lang.graph import oov_word, read_symbols
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


def filler_phone(lang_dir: str | Path) -> tuple[str, int]:
    """The lang's filler phone: the one-phone pronunciation of its OOV word (``oov.txt``; Kaldi's SPN), and its id."""
    lang, oov = Path(lang_dir), oov_word(lang_dir)
    prons = [line.split()[1:] for line in (lang / "lexicon.txt").read_text(encoding="utf-8").splitlines()
             if line.split()[:1] == [oov]]
    if len(prons) != 1 or len(prons[0]) != 1:
        raise NnetError(f"edge_fragments.label filler: the OOV word {oov} of {lang / 'lexicon.txt'} must have one "
                        f"pronunciation of one phone (got {prons})")
    return prons[0][0], read_symbols(lang / "phones.txt")[prons[0][0]]


def own_pdf(phone_pdfs: dict[int, set[int]], phone: int, name: str = "") -> int:
    """The one pdf that ``phone`` has and no other phone uses (``phone_pdfs``: phone id -> its pdfs)."""
    own = set(phone_pdfs.get(phone, set()))
    shared = own & set().union(*(p for ph, p in phone_pdfs.items() if ph != phone))
    if len(own) != 1 or shared:
        raise NnetError(f"edge_fragments.label filler: {name or phone} has pdfs {sorted(own)} "
                        f"(shared with other phones: {sorted(shared)}); it needs one of its own")
    return own.pop()


def filler_pdf(gmm_dir: str | Path | None, lang_dir: str | Path | None) -> int:
    """The pdf of the lang's filler phone (:func:`filler_phone`) in the GMM of ``gmm_dir``: the label of the
    fragments with ``edge_fragments.label: filler``, which a graph with edge fillers
    (:func:`asrflow.lang.graph.add_edge_filler`) lets cover a piece of a word at an utterance's edge."""
    from asrflow.gmm.model import GmmModel

    if gmm_dir is None or lang_dir is None:
        raise NnetError("edge_fragments.label filler needs the GMM (--gmm) and the lang folder (--lang)")
    name, phone = filler_phone(lang_dir)
    tm = GmmModel.load(gmm_dir).tm
    pdfs: dict[int, set[int]] = defaultdict(set)
    for tid in range(1, tm.num_transition_ids + 1):
        pdfs[tm.transition_id_to_phone(tid)].add(tm.transition_id_to_pdf(tid))
    return own_pdf(pdfs, phone, f"{name} in {gmm_dir}")


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
                 max_frames: int, frame_targets: bool = True, label: int | None = None) -> None:
        self.probability, self.max_frames = probability, max(max_frames, MIN_FRAMES)
        self.frame_targets, self.label = frame_targets, label
        self.speech = speech
        self.spans = {utt: word_spans(speech[utt]) for utt, _ in utterances if utt in speech}
        by_speaker: dict[str, list[int]] = defaultdict(list)
        for index, (utt, spk) in enumerate(utterances):
            if self.spans.get(utt):
                by_speaker[spk].append(index)
        everyone = [i for ids in by_speaker.values() for i in ids]
        self.donors = {spk: ids if len(ids) > 1 else everyone for spk, ids in by_speaker.items()}
        self.speaker = dict(utterances)
        self.names = [utt for utt, _ in utterances]

    def expected_frames(self, targets: dict[str, np.ndarray], num_classes: int) -> np.ndarray:
        """Frames per class that the fragments add to one epoch, in expectation: per utterance and silent
        edge, ``probability`` x the mean over donors and their words of E[min(L, word length)], L uniform on
        MIN_FRAMES..max_frames, under the label those frames get."""
        lengths = np.arange(MIN_FRAMES, self.max_frames + 1)
        mean_piece = {utt: float(np.mean([np.minimum(lengths, end - start).mean() for start, end in spans]))
                      for utt, spans in self.spans.items() if spans}
        per_speaker = {spk: float(np.mean([mean_piece[self.names[i]] for i in ids]))
                       for spk, ids in self.donors.items()}
        added = np.zeros(num_classes)
        for utt in self.names:
            speech, target, spk = self.speech.get(utt), targets.get(utt), self.speaker[utt]
            if speech is None or target is None or spk not in per_speaker or not len(speech):
                continue
            for silent, edge in ((not speech[0], target[0]), (not speech[-1], target[-1])):
                if silent:
                    added[edge if self.label is None else self.label] += self.probability * per_speaker[spk]
        return added

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
        fixed = None if self.label is None else torch.tensor([self.label], dtype=target.dtype)
        if head is not None:
            parts.insert(0, head)
            labels.insert(0, (target[:1] if fixed is None else fixed).expand(len(head)))
        if tail is not None:
            parts.append(tail)
            labels.append((target[-1:] if fixed is None else fixed).expand(len(tail)))
        return utt, torch.cat(parts), torch.cat(labels) if self.frame_targets else target
