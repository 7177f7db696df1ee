"""Build E-step / decoding shards of one split from the data, features and lang stages."""

from __future__ import annotations

import zlib
from itertools import zip_longest
from pathlib import Path

import kaldiio

from asrflow.cluster import shard
from asrflow.data.datadir import read_table
from asrflow.features import Projection
from asrflow.features.ark import read_scp
from asrflow.gmm.estep import Shard
from asrflow.lang.graph import read_symbols
from asrflow.lang.lexicon import OOV_WORD


def split_shards(data_dir: str | Path, feats_dir: str | Path, lang_dir: str | Path, split: str,
                 shard_utts: int, deltas: int = 2, only: set[str] | None = None,
                 cmvn: str = "speaker", projection: Projection | None = None) -> list[Shard]:
    """Shards of ``split`` (sorted utterances with features, those in ``only`` if given), transcripts as word ids
    (OOV → ``<unk>``); ``cmvn`` ``utterance``: features normalised per utterance, not per speaker;
    ``projection``: spliced frames through it instead of Δ features (``deltas`` must then be 0)."""
    if projection is not None and deltas:
        raise ValueError("a projection replaces the deltas: give deltas=0 with it")
    data_dir, feats_dir = Path(data_dir), Path(feats_dir)
    text = read_table(data_dir / split / "text")
    utt2spk = read_table(data_dir / split / "utt2spk")
    scp = read_scp(feats_dir / split / "feats.scp")
    stats = {spk: mat for spk, mat in kaldiio.load_scp(str(feats_dir / split / "cmvn.scp")).items()}
    words = read_symbols(Path(lang_dir) / "words.txt")
    oov = words[OOV_WORD]
    utts = [u for u in sorted(text) if u in scp and (only is None or u in only)]
    identity = zlib.crc32("".join(f"{u}{scp[u]}" for u in utts).encode())
    out = []
    for i, group in enumerate(shard(utts, shard_utts)):
        speakers = tuple(utt2spk[u] for u in group)
        out.append(Shard(
            key=f"{feats_dir}/{split}/{identity:08x}/{deltas}/{shard_utts}/{cmvn}/{i}",  # each variant its own
            utts=tuple(group),
            feats=tuple(scp[u] for u in group),
            speakers=speakers,
            word_ids=tuple(tuple(words.get(w, oov) for w in text[u].split()) for u in group),
            cmvn={} if cmvn == "utterance" else {s: stats[s] for s in set(speakers)},
            lang_dir=str(lang_dir),
            deltas=deltas,
            per_utterance=cmvn == "utterance",
            projection=projection,
        ))
    return out


def subset_utterances(frames: dict[str, int], utt2spk: dict[str, str], count: int, by: str) -> set[str]:
    """``count`` utterances of a split (Kaldi's ``utils/subset_data_dir.sh``): ``shortest``, the fewest frames
    (ties by id); ``speakers``, each speaker's first utterance in turn, then each one's second, and so on."""
    if by == "shortest":
        return set(sorted(frames, key=lambda u: (frames[u], u))[:count])
    if by != "speakers":
        raise ValueError(f"unknown subset kind {by!r}: shortest or speakers")
    by_speaker: dict[str, list[str]] = {}
    for utt in sorted(frames):
        by_speaker.setdefault(utt2spk[utt], []).append(utt)
    turns = zip_longest(*(by_speaker[s] for s in sorted(by_speaker)))
    return set([u for turn in turns for u in turn if u is not None][:count])


def split_subset(data_dir: str | Path, feats_dir: str | Path, split: str, count: int, by: str,
                 only: set[str] | None = None) -> set[str] | None:
    """The utterances of ``split`` with features (those in ``only`` if given) that :func:`subset_utterances` picks
    (their frame counts from ``utt2num_frames``); None when ``count`` covers them all."""
    lengths = {u: int(n) for u, n in read_table(Path(feats_dir) / split / "utt2num_frames").items()}
    utts = set(read_table(Path(data_dir) / split / "text")) & set(lengths)
    if only is not None:
        utts &= only
    if count >= len(utts):
        return None
    utt2spk = read_table(Path(data_dir) / split / "utt2spk")
    return subset_utterances({u: lengths[u] for u in utts}, utt2spk, count, by)
