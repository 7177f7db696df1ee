"""Build E-step / decoding shards of one split from the data, features and lang stages."""

from __future__ import annotations

import dataclasses
import heapq
import sys
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import kaldiio

from asrflow.data.datadir import read_table
from asrflow.data.tables import Unsorted, drain, lookup, ordered_rows, sorted_rows
from asrflow.features import Projection
from asrflow.features.ark import read_scp
from asrflow.gmm.estep import Shard
from asrflow.lang.graph import read_symbols
from asrflow.lang.lexicon import OOV_WORD


def _joined(data_dir: Path, feats_dir: Path, split: str,
            merge: bool) -> Iterator[tuple[str, str, str | None, str | None]]:
    """(utterance, transcript, speaker, feature location) of every utterance with a transcript, in sorted order:
    with ``merge`` the sorted tables merged as they are read (no table held whole; ``Unsorted`` when one is not
    sorted), else looked up in dicts."""
    paths = (data_dir / split / "text", data_dir / split / "utt2spk", feats_dir / split / "feats.scp")
    if merge:
        spk_rows, feat_rows = sorted_rows(paths[1]), sorted_rows(paths[2])
        speaker, feats = lookup(spk_rows), lookup(feat_rows)
        yield from ((utt, text, speaker(utt), feats(utt)) for utt, text in sorted_rows(paths[0]))
        drain(spk_rows, feat_rows)
        return
    text, utt2spk, scp = read_table(paths[0]), read_table(paths[1]), read_scp(paths[2])
    yield from ((utt, text[utt], utt2spk.get(utt), scp.get(utt)) for utt in sorted(text))


def split_shards(data_dir: str | Path, feats_dir: str | Path, lang_dir: str | Path, split: str,
                 shard_utts: int, deltas: int = 2, only: set[str] | None = None,
                 cmvn: str = "speaker", projection: Projection | None = None) -> list[Shard]:
    """Shards of ``split`` (sorted utterances with features, those in ``only`` if given), transcripts as word ids
    (OOV → ``<unk>``); ``cmvn`` ``utterance``: features normalised per utterance, not per speaker;
    ``projection``: spliced frames through it instead of Δ features (``deltas`` must then be 0).

    The tables are read a line at a time and each shard packed as soon as it is full, so the driver never
    holds a whole split's tables (see :class:`~asrflow.gmm.estep.Shard`)."""
    if projection is not None and deltas:
        raise ValueError("a projection replaces the deltas: give deltas=0 with it")
    try:
        return _split(Path(data_dir), Path(feats_dir), lang_dir, split, shard_utts, deltas, only, cmvn, projection,
                      merge=True)
    except Unsorted:  # a table written by hand, out of order: read them whole
        return _split(Path(data_dir), Path(feats_dir), lang_dir, split, shard_utts, deltas, only, cmvn, projection,
                      merge=False)


def _split(data_dir: Path, feats_dir: Path, lang_dir: str | Path, split: str, shard_utts: int, deltas: int,
           only: set[str] | None, cmvn: str, projection: Projection | None, merge: bool) -> list[Shard]:
    """:func:`split_shards` with the tables merged as read (``merge``) or looked up in dicts."""
    stats = {spk: mat for spk, mat in kaldiio.load_scp(str(feats_dir / split / "cmvn.scp")).items()}
    words = read_symbols(Path(lang_dir) / "words.txt")
    oov = words[OOV_WORD]
    identity = 0
    out: list[Shard] = []
    group: list[tuple[str, str, str, str]] = []

    def pack() -> None:
        speakers = tuple(sys.intern(spk) for _, _, spk, _ in group)  # one string per speaker, not per utterance;
        # ids interned: the alignment store (asrflow.gmm.alignments) shares them
        out.append(Shard(
            key="", utts=tuple(sys.intern(utt) for utt, _, _, _ in group), speakers=speakers,
            payload=Shard.pack(tuple(f for _, _, _, f in group),
                               tuple(tuple(words.get(w, oov) for w in text.split()) for _, text, _, _ in group),
                               {} if cmvn == "utterance" else {s: stats[s] for s in set(speakers)}),
            lang_dir=str(lang_dir), deltas=deltas, per_utterance=cmvn == "utterance", projection=projection))
        group.clear()

    for utt, text, spk, feats in _joined(data_dir, feats_dir, split, merge):
        if feats is None or (only is not None and utt not in only):
            continue
        if spk is None:
            raise ValueError(f"{data_dir / split / 'utt2spk'}: utterance {utt} has no speaker")
        identity = zlib.crc32(f"{utt}{feats}".encode(), identity)
        group.append((utt, text, spk, feats))
        if len(group) == shard_utts:
            pack()
    if group:
        pack()
    # each variant (features, split, its utterances, deltas, shard size, CMVN) its own key
    return [dataclasses.replace(s, key=f"{feats_dir}/{split}/{identity:08x}/{deltas}/{shard_utts}/{cmvn}/{i}")
            for i, s in enumerate(out)]


Utterances = Callable[[], Iterator[tuple[str, int, str]]]


def subset_utterances(rows: Utterances, count: int, by: str) -> set[str]:
    """``count`` utterances of a split (Kaldi's ``utils/subset_data_dir.sh``): ``shortest``, the fewest frames
    (ties by id); ``speakers``, each speaker's first utterance in turn (speakers in id order), then each one's
    second, and so on. ``rows()`` gives ``(utterance, frames, speaker)`` in utterance order, afresh at each
    call; the split is read in a few passes and only the subset and a count per speaker are held."""
    if by == "shortest":
        return {utt for _, utt in heapq.nsmallest(count, ((frames, utt) for utt, frames, _ in rows()))}
    if by != "speakers":
        raise ValueError(f"unknown subset kind {by!r}: shortest or speakers")
    per_speaker = Counter(spk for _, _, spk in rows())
    turns = _turns(sorted(per_speaker.values()), count)
    seen: Counter = Counter()
    kept = []
    for utt, _, spk in rows():
        if seen[spk] < turns:
            kept.append((seen[spk], spk, utt))
        seen[spk] += 1
    return {utt for _, _, utt in sorted(kept)[:count]}


def _turns(counts: list[int], count: int) -> int:
    """The fewest turns (utterances a speaker at most) that give ``count`` utterances from speakers with
    ``counts`` utterances each (sorted), or every utterance when they hold fewer."""
    low, high = 0, counts[-1] if counts else 0
    while low < high:
        middle = (low + high) // 2
        if sum(min(c, middle) for c in counts) >= count:
            high = middle
        else:
            low = middle + 1
    return high


def split_subset(data_dir: str | Path, feats_dir: str | Path, split: str, count: int, by: str,
                 only: set[str] | None = None) -> set[str] | None:
    """The utterances of ``split`` with features (those in ``only`` if given) that :func:`subset_utterances` picks
    (their frame counts from ``utt2num_frames``, speakers from ``utt2spk``, the tables read a line at a time);
    None when ``count`` covers them all."""
    def rows() -> Iterator[tuple[str, int, str]]:
        frames = lookup(ordered_rows(Path(feats_dir) / split / "utt2num_frames"))
        speaker = lookup(ordered_rows(Path(data_dir) / split / "utt2spk"))
        for utt, _ in ordered_rows(Path(data_dir) / split / "text"):
            length = frames(utt)
            if length is not None and (only is None or utt in only):
                yield utt, int(length), speaker(utt) or utt

    if count >= sum(1 for _ in rows()):
        return None
    return subset_utterances(rows, count, by)
