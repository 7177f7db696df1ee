"""The training utterances held out of acoustic model training, for early stopping and decoder tuning.

Every network holds the same utterances out (``nnet.valid_fraction``, ``nnet.hold_out``), and
with ``gmm.hold_out`` so do the GMM systems (they align them after training, for the networks'
validation), so that decoder tuning on them meets speech no acoustic model was trained on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from asrflow.data.datadir import own_texts, read_table
from asrflow.data.groups import group_of_speaker


def held_out(utterances: list[str], fraction: float, seed: int) -> set[str]:
    """A seeded random ``fraction`` of the training utterances (at least one) for validation."""
    count = max(1, round(fraction * len(utterances)))
    order = np.random.default_rng(seed).permutation(len(utterances))
    ordered = sorted(utterances)
    return {ordered[i] for i in order[:count]}


def held_out_utterances(config: dict[str, Any], data_dir: str | Path, train_split: str) -> set[str]:
    """The training utterances every network of ``config`` holds out of training (early stopping, decoder tuning):
    the experiment's own corpus's, never a ``corpus.extra_training`` one (tuning decodes them with its LM).
    ``nnet.hold_out`` ``speakers``: all the utterances of a seeded random choice of speakers, so that tuning
    meets voices that training did not; ``groups``: such speakers drawn from every group of speakers of
    ``evaluation.groups`` (gender, age range, ...), so that they are as varied as the training speakers."""
    utts = sorted(own_texts(Path(data_dir) / train_split))
    fraction, seed = config["nnet"]["valid_fraction"], config["seed"]
    if config["nnet"]["hold_out"] == "utterances":
        return held_out(utts, fraction, seed)
    utt2spk = read_table(Path(data_dir) / train_split / "utt2spk")
    if config["nnet"]["hold_out"] == "groups":
        group_of = group_of_speaker(Path(data_dir) / train_split, config["evaluation"]["groups"])
        return held_out_by_group(utts, utt2spk, group_of, fraction, seed)
    return held_out_speakers(utts, utt2spk, fraction, seed)


def held_out_speakers(utterances: list[str], utt2spk: dict[str, str], fraction: float, seed: int) -> set[str]:
    """Every utterance of seeded random speakers, taken until they hold ``fraction`` of the utterances (at least
    one speaker; never all of them when there are two or more)."""
    speakers = sorted({utt2spk[u] for u in utterances})
    order = np.random.default_rng(seed).permutation(len(speakers))
    by_speaker: dict[str, list[str]] = {}
    for u in utterances:
        by_speaker.setdefault(utt2spk[u], []).append(u)
    chosen: set[str] = set()
    for i in order[: max(1, len(speakers) - 1)]:
        chosen.update(by_speaker[speakers[i]])
        if len(chosen) >= fraction * len(utterances):
            break
    return chosen



def held_out_by_group(utterances: list[str], utt2spk: dict[str, str], group_of: dict[str, tuple[str, ...]],
                      fraction: float, seed: int) -> set[str]:
    """:func:`held_out_speakers` within each group of speakers (``group_of``: speaker → its groups; speakers it
    lacks form one group together), so every group gives about ``fraction`` of its utterances. A group of one
    speaker gives none, unless it is the only group."""
    by_group: dict[tuple[str, ...], list[str]] = {}
    for u in utterances:
        by_group.setdefault(group_of.get(utt2spk[u], ()), []).append(u)
    chosen: set[str] = set()
    for i, key in enumerate(sorted(by_group)):
        members = by_group[key]
        if len(by_group) > 1 and len({utt2spk[u] for u in members}) < 2:
            continue
        chosen |= held_out_speakers(members, utt2spk, fraction, seed + i)
    return chosen
