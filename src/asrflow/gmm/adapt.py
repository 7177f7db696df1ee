"""The fmllr stage: speaker-adapted features from a GMM system (Kaldi's ``align_fmllr.sh``,
``decode_fmllr.sh`` and ``steps/nnet/make_fmllr_feats.sh``).

Every speaker of a training split (and of its speed-perturbed copies, each copy speaker on its
own) and of the test splits paired with it gets one fMLLR transform (:mod:`asrflow.gmm.fmllr`)
of the GMM's features (CMVN, then Δ+ΔΔ). Training speakers: from their forced alignments.
Test speakers, unsupervised: a first decoding pass with the speaker-independent system, its
1-best hypotheses force-aligned, a transform estimated; ``passes`` > 1 decodes again with the
adapted features and refines the transform. Silence frames count ``silence_weight`` times.
Speakers with too few frames keep the identity, and are listed in the report. For a
speaker-adaptively trained system (``sat``) every transform starts from the one its source
system (``tri``) estimated, and the new estimate against the sat model is composed on top.

Output folder (``results/<exp>/fmllr/<train>/<system>/``), a feature kind networks can read
(``nnet.features: fmllr``)::

    <split>/feats.ark feats.scp utt2num_frames   adapted features of each split
    <split>/cmvn.ark cmvn.scp                     zero statistics: CMVN leaves adapted features as they are
    <split>/trans.txt                             each speaker's transform [A b], one row per line
    report.tsv                                    speakers kept at the identity, utterances without statistics
    manifest.json                                 speakers, frames, objective gain per pass, timing
"""

from __future__ import annotations

import json
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from asrflow.cluster import broadcast, iter_sharded, run_sharded
from asrflow.config.paths import Paths
from asrflow.data.perturb import perturbed_split
from asrflow.decode.decoder import DecodeOptions, decode_all, gmm_decodable, gmm_decode_options
from asrflow.features.ark import write_ark, write_text_atomic
from asrflow.gmm import fmllr
from asrflow.gmm.alignments import Alignment, load_alignment, read_alignments, shard_alignments
from asrflow.gmm.estep import AlignOptions, Shard, features, text_graph, tree_key, viterbi_alignment
from asrflow.gmm.lda import gmm_features
from asrflow.gmm.model import GmmModel
from asrflow.gmm.shards import split_shards
from asrflow.gmm.transforms import StoredTransforms, TransformRef, Transforms, matrix
from asrflow.lang.graph import read_symbols
from asrflow.lang.lexicon import OOV_WORD
from asrflow.workflow import train_split


@dataclass(frozen=True)
class AdaptOptions:
    """How statistics are gathered: the first pass's decoder, the aligner, the weight of silence frames."""

    decode: DecodeOptions = field(default_factory=DecodeOptions)
    align: AlignOptions = field(default_factory=AlignOptions)
    silence_weight: float = 0.01


@dataclass
class SpeakerStats:
    """One shard's fMLLR statistics per speaker, with the hypotheses and what had none."""

    stats: dict[str, fmllr.FmllrStats]
    hyps: dict[str, list[str]]
    failed: list[tuple[str, str]]


def adapted(shard: Shard, transforms: Mapping[str, np.ndarray | TransformRef]) -> list[np.ndarray]:
    """The shard's GMM features, each through its speaker's transform (none: as they are)."""
    return [fmllr.apply(matrix(transforms[s]), x) if s in transforms else x
            for x, s in zip(features(shard), shard.speakers)]


def speaker_stats(item: tuple[Shard, dict[str, Alignment] | None, dict[str, np.ndarray]], model_blob: bytes,
                  graph_path: str, opts: AdaptOptions) -> SpeakerStats:
    """fMLLR statistics of a shard's speakers on their current adapted features (a Dask task): the item is the
    shard, its alignments and its speakers' current transforms.

    With alignments (training speakers) they give the frames' pdfs; without (test speakers),
    the shard is decoded with ``graph_path`` and each 1-best hypothesis force-aligned.
    """
    shard, alignments, transforms = item
    model = GmmModel.from_bytes(model_blob)
    feats = adapted(shard, transforms)
    hyps: dict[str, list[str]] = {}
    lang = Path(shard.lang_dir)
    if alignments is None:
        items = [(u, len(x), lambda x=x: gmm_decodable(model, x, opts.decode.acoustic_scale))
                 for u, x in zip(shard.utts, feats)]
        hyps = decode_all(graph_path, opts.decode, items).hyps
        words = read_symbols(lang / "words.txt")
        tree_id = tree_key(model)
    silence = [int(p) for p in (lang / "silence.int").read_text().split()]
    phone_of, _ = model.tid_tables
    per_speaker: dict[str, tuple[list, list, list]] = defaultdict(lambda: ([], [], []))
    failed: list[tuple[str, str]] = []
    for utt, spk, x in zip(shard.utts, shard.speakers, feats):
        if alignments is not None:
            ali = load_alignment(alignments[utt]) if utt in alignments else None
            reason = "no forced alignment"
        elif not hyps.get(utt):
            ali, reason = None, "the first pass decoded no words"
        else:
            graph = text_graph(model, shard.lang_dir, [words.get(w, words[OOV_WORD]) for w in hyps[utt]], tree_id)
            ali = viterbi_alignment(model, graph, x, utt, opts.align)[0]
            reason = "its hypothesis could not be aligned"
        if ali is None:
            failed.append((utt, reason))
            continue
        x_list, pdf_list, weight_list = per_speaker[spk]
        x_list.append(x)
        pdf_list.append(model.tid2pdf[ali])
        weight_list.append(np.where(np.isin(phone_of[ali], silence), opts.silence_weight, 1.0))
    stats = {spk: fmllr.accumulate(model, *lists) for spk, lists in per_speaker.items()}
    return SpeakerStats(stats, hyps, failed)


def shard_transforms(shard: Shard, transforms: Mapping[str, np.ndarray]) -> dict[str, np.ndarray | TransformRef]:
    """The transforms of a shard's speakers (what its task is given, not every speaker's): where each is when
    they are stored (:class:`~asrflow.gmm.transforms.StoredTransforms`; the task reads them), else the arrays."""
    speakers = [spk for spk in sorted(set(shard.speakers)) if spk in transforms]
    if isinstance(transforms, StoredTransforms):
        return {spk: transforms.ref(spk) for spk in speakers}
    return {spk: transforms[spk] for spk in speakers}


def estimate_speaker(spk: str, stats: fmllr.FmllrStats, transforms: Transforms, cfg: dict[str, Any],
                     identity: dict[str, str]) -> float | None:
    """Estimate ``spk``'s transform on top of its current one (``transforms``, updated in place) and return its
    objective gain per frame; with too few frames, the speaker goes into ``identity`` with the reason."""
    try:
        w = fmllr.estimate(stats, iterations=cfg["iterations"], min_count=cfg["min_frames"])
    except fmllr.FmllrError as err:
        identity[spk] = str(err)
        return None
    transforms[spk] = fmllr.compose(w, transforms[spk]) if spk in transforms else w
    return fmllr.objective(stats, w) - fmllr.objective(stats, fmllr.identity(w.shape[0]))


def adapt_pass(client: Any, shards: list[Shard], alignments: Mapping[str, np.ndarray] | None, blob: Any,
               graph_path: str, transforms: Transforms, opts: AdaptOptions, cfg: dict[str, Any],
               identity: dict[str, str], desc: str, retries: int) -> tuple[dict[str, float], list[tuple[str, str]]]:
    """One pass of fMLLR over ``shards``: every speaker's statistics on its current features, and its transform
    (``transforms`` and ``identity`` updated as :func:`estimate_speaker` does); each speaker's gain per frame,
    and the utterances without statistics.

    A speaker is estimated as soon as every shard with its utterances has reported, from their statistics
    summed in shard order (so the same whichever shard finishes first), and its statistics are then dropped:
    the driver holds those of the speakers still open, a few shards' worth, not the split's.
    """
    items = [(s, None if alignments is None else shard_alignments(alignments, s.utts), shard_transforms(s, transforms))
             for s in shards]
    left = Counter(spk for s in shards for spk in set(s.speakers))
    parts: dict[str, dict[int, fmllr.FmllrStats]] = defaultdict(dict)
    gains: dict[str, float] = {}
    failed: list[tuple[str, str]] = []
    for i, result in iter_sharded(client, speaker_stats, items, blob, graph_path, opts,
                                  units=[len(s.utts) for s in shards], desc=desc, retries=retries):
        failed += result.failed
        for spk, st in result.stats.items():
            parts[spk][i] = st
        for spk in set(shards[i].speakers):
            left[spk] -= 1
            if left[spk] == 0 and spk in parts:
                own = parts.pop(spk)
                total = own[min(own)]
                for j in sorted(own)[1:]:
                    total = total + own[j]
                gain = estimate_speaker(spk, total, transforms, cfg, identity)
                if gain is not None:
                    gains[spk] = gain
    return gains, sorted(failed)


def write_adapted(item: tuple[Shard, str, dict[str, np.ndarray | TransformRef]]) -> tuple[list[str], list[int], int]:
    """Write a shard's adapted features (the item: the shard, its archive, its speakers' transforms) to its own
    archive (a Dask task: the matrices never reach the driver); its scp lines, frame counts and feature
    dimension."""
    shard, ark, transforms = item
    matrices = adapted(shard, transforms)
    lines = write_ark(ark, zip(shard.utts, matrices))
    return lines, [len(m) for m in matrices], matrices[0].shape[1] if matrices else 0


def write_split(folder: Path, written: list[tuple[list[str], list[int], int]], utts: list[str],
                utt2spk: dict[str, str], transforms: Mapping[str, np.ndarray]) -> None:
    """A split's adapted features as a feature kind, from its shards' archives (``written``, in the order of
    ``utts``): scp, frame counts, zero CMVN statistics, transforms."""
    folder.mkdir(parents=True, exist_ok=True)
    write_text_atomic(folder / "feats.scp", [line for lines, _, _ in written for line in lines])
    write_text_atomic(folder / "utt2num_frames",
                      [f"{u} {n}" for u, n in zip(utts, (n for _, counts, _ in written for n in counts))])
    dim = max((d for _, _, d in written), default=0)
    zero = np.zeros((2, dim + 1))
    zero[0, -1] = 1.0  # a count of one and zero sums: mean 0
    speakers = sorted({utt2spk[u] for u in utts})
    write_text_atomic(folder / "cmvn.scp", write_ark(folder / "cmvn.ark", [(s, zero) for s in speakers]))
    write_text_atomic(folder / "trans.txt", [f"{s} " + " ".join(f"{v:.6g}" for v in transforms[s].ravel())
                                             for s in speakers if s in transforms])


def read_transforms(path: Path, into: Transforms | None = None) -> Transforms:
    """A ``trans.txt`` written by :func:`write_split`: speaker → its transform [A b] (put into ``into``, a dict
    or a :class:`~asrflow.gmm.transforms.StoredTransforms`, when given; read a line at a time)."""
    out: Transforms = {} if into is None else into
    with open(path, encoding="utf-8") as lines:
        for line in lines:
            if not line.strip():
                continue
            spk, *values = line.split()
            row = np.asarray(values, dtype=np.float64)
            dim = int((np.sqrt(1 + 4 * row.size) - 1) / 2)  # dim × (dim + 1) values
            if dim * (dim + 1) != row.size:
                raise ValueError(f"{path}: speaker {spk} has {row.size} values, not a d × (d + 1) transform")
            out[spk] = row.reshape(dim, dim + 1)
    return out


def adapt_splits(config: dict[str, Any], system: str, train: str, paths: Paths, client: Any,
                 log: Callable[[str], None] = print) -> dict[str, Any]:
    """Write the adapted features of ``train``, its speed-perturbed copies (when ``paths.alignments``
    holds their alignments) and its test splits into ``paths.out``; returns the manifest.

    The GMM system is ``paths.gmm`` (its graph ``paths.graph`` for the test speakers' first passes), its
    features ``paths.features``. ``paths.init``: another fmllr stage's output whose transforms every speaker
    starts from (for a speaker-adaptively trained system, those of the system it was trained on: its first
    decoding pass then sees the features it was trained on); the new estimate is composed on top.
    """
    start = time.perf_counter()
    out, data_dir, feats_dir, lang_dir = paths.out, paths.data, paths.features, paths.lang
    gmm_dir, graph_dir, align_dir, init_dir = paths.gmm, paths.graph, paths.alignments, paths.init
    out.mkdir(parents=True, exist_ok=True)
    cfg = config["fmllr"]
    first_pass = replace(gmm_decode_options(config["decode"]), beam=cfg["beam"], max_active=cfg["max_active"])
    opts = AdaptOptions(first_pass,
                        AlignOptions(beam=config["gmm"][system]["beam"],
                                     retry_beam=config["gmm"][system]["retry_beam"]),
                        cfg["silence_weight"])
    model = GmmModel.load(gmm_dir)
    blob = broadcast(client, model.to_bytes())
    graph_path = str(graph_dir.resolve() / "HCLG.fst")
    splits: dict[str, Mapping[str, np.ndarray] | None] = {train: read_alignments(gmm_dir / "ali")}
    if align_dir is not None:
        splits[perturbed_split(train)] = read_alignments(Path(align_dir) / "ali")
    manifest_splits = json.loads((data_dir / "manifest.json").read_text(encoding="utf-8"))["splits"]
    for split in manifest_splits:
        if split.endswith("test") and train_split(split, config) == train:
            splits[split] = None
    report, summary = [], {}
    for split, alignments in splits.items():
        shards = split_shards(data_dir, feats_dir, lang_dir, split, config["gmm"]["shard_utts"],
                              **gmm_features(gmm_dir))
        start_from = Path(init_dir) / split / "trans.txt" if init_dir is not None else None
        transforms = StoredTransforms(out / split / ".transforms")  # removed once trans.txt is written
        if start_from is not None and start_from.is_file():
            read_transforms(start_from, into=transforms)
        identity: dict[str, str] = {}
        passes = 1 if alignments is not None else cfg["passes"]
        gains, failed = [], []
        for p in range(passes):
            identity.clear()
            gain, failed = adapt_pass(client, shards, alignments, blob, graph_path, transforms, opts, cfg, identity,
                                      f"fmllr-{split}-pass{p + 1}", config["dask"]["retries"])
            gains.append(round(float(np.mean(list(gain.values()))), 4) if gain else 0.0)
        (out / split).mkdir(parents=True, exist_ok=True)
        arks = [str(out / split / f"feats.{i}.ark") for i in range(len(shards))]
        written = run_sharded(client, write_adapted,
                              [(s, ark, shard_transforms(s, transforms)) for s, ark in zip(shards, arks)],
                              units=[len(s.utts) for s in shards], desc=f"fmllr-{split}-write",
                              retries=config["dask"]["retries"])
        utt2spk = {u: s for sh in shards for u, s in zip(sh.utts, sh.speakers)}
        write_split(out / split, written, [u for sh in shards for u in sh.utts], utt2spk, transforms)
        adapted_count = len(transforms)
        transforms.remove()
        kept = "its starting transform" if init_dir is not None else "the identity"
        report += [(split, "speaker", spk, f"kept {kept}: {why}") for spk, why in sorted(identity.items())]
        report += [(split, "utterance", utt, f"no statistics: {why}") for utt, why in sorted(failed)]
        summary[split] = {"supervised": alignments is not None, "utterances": len(utt2spk),
                          "speakers": len(set(utt2spk.values())), "adapted": adapted_count,
                          "identity": len(identity), "without_statistics": len(failed),
                          "gain_per_frame_by_pass": gains}
        log(f"fmllr {split}: {adapted_count} of {summary[split]['speakers']} speakers adapted, "
            f"objective gain per frame {gains}, {len(failed)} utterances without statistics")
    write_text_atomic(out / "report.tsv", ["split\tkind\tid\treason"] + ["\t".join(r) for r in report])
    manifest = {"system": system, "train": train, "splits": summary, "passes": cfg["passes"],
                "started_from": str(init_dir) if init_dir is not None else None,
                "dim": model.am.dim, "seconds": round(time.perf_counter() - start, 3)}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest
