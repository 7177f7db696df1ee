"""The scale benchmark's GMM stages, with a trained system, and the networks' data path:

- ``mono``: the monophone's subset picked (``gmm.mono.subset`` utterances, else :data:`MONO_SUBSET`, as
  ``gmm.mono.subset_by`` chooses them), then one E-step that aligns it with the trained monophone (the
  system's sibling ``mono``) and the M-step: a pass whose cost should not grow with the corpus;
- ``realign``: one E-step that aligns every utterance (the workers write the alignments and sum the
  statistics);
- ``accumulate``: one E-step from those alignments, then the M-step;
- ``tree``: tree statistics from the alignments, summed on the workers, and the tree built from them
  (``gmm.tri``'s sizes);
- ``fmllr``: one pass of fMLLR statistics and a transform for every speaker;
- ``alignments``: the alignments written as Kaldi archives (``ali/``) and read back, every one;
- ``nnet_read``: one epoch of the networks' data path (read, CMVN, pad; no model).

Without audio, :func:`replicate` makes a size from a split's stored features instead (copies of its
utterances and speakers under new ids; no audio is read again).
"""

from __future__ import annotations

import pickle
import time
from pathlib import Path
from typing import Any

from asrflow.cluster import broadcast, run_reduced
from asrflow.data.datadir import read_table
from asrflow.features.ark import read_scp
from asrflow.gmm.alignments import read_alignments, shard_alignments, write_alignments
from asrflow.gmm.lda import gmm_features
from asrflow.gmm.model import GmmModel
from asrflow.gmm.shards import split_shards, split_subset
from asrflow.gmm.train import estep_task
from asrflow.gmm.update import m_step, merge_results
from asrflow.scale.size import Size


def replicate(data_dir: Path, feats_dir: Path, split: str, hours: float, out: Path) -> dict[str, Any]:
    """Write ``out/data/<split>`` and ``out/features/<split>``: copies ``c<k>-`` of ``split``'s utterances and
    speakers (the last copy cut short) until they hold ``hours`` of audio; their counts."""
    frames = {u: int(n) for u, n in read_table(feats_dir / split / "utt2num_frames").items()}
    text, utt2spk = read_table(data_dir / split / "text"), read_table(data_dir / split / "utt2spk")
    feats, cmvn = read_scp(feats_dir / split / "feats.scp"), read_scp(feats_dir / split / "cmvn.scp")
    utts = sorted(u for u in frames if u in text and u in feats)
    target = hours * 360_000  # frames of 10 ms
    lines: dict[str, list[str]] = {name: [] for name in ("text", "utt2spk", "feats.scp", "utt2num_frames")}
    speakers: set[str] = set()
    total, copy = 0, 0
    while total < target:
        for utt in utts:
            if total >= target:
                break
            new, spk = f"c{copy}-{utt}", f"c{copy}-{utt2spk[utt]}"
            lines["text"].append(f"{new} {text[utt]}")
            lines["utt2spk"].append(f"{new} {spk}")
            lines["feats.scp"].append(f"{new} {feats[utt]}")
            lines["utt2num_frames"].append(f"{new} {frames[utt]}")
            speakers.add(spk)
            total += frames[utt]
        copy += 1
    for folder, names in ((out / "data" / split, ("text", "utt2spk")),
                          (out / "features" / split, ("feats.scp", "utt2num_frames"))):
        folder.mkdir(parents=True, exist_ok=True)
        for name in names:
            (folder / name).write_text("".join(sorted(line + "\n" for line in lines[name])))
    (out / "features" / split / "cmvn.scp").write_text(
        "".join(f"{spk} {cmvn[spk.split('-', 1)[1]]}\n" for spk in sorted(speakers)))
    for name in ("spk2gender", "spk2age"):  # the groups held-out speakers are drawn from
        if (data_dir / split / name).is_file():
            table = read_table(data_dir / split / name)
            (out / "data" / split / name).write_text(
                "".join(f"{spk} {table[spk.split('-', 1)[1]]}\n" for spk in sorted(speakers)))
    return {"utterances": len(lines["text"]), "speakers": len(speakers), "frames": total, "copies": copy}


MONO_SUBSET = 2000  # utterances: Kaldi's large recipes train their monophone on the 2,000 shortest


def _mono(size: Size, client: Any) -> dict[str, Any]:
    cfg = size.config["gmm"]["mono"]
    model_dir = size.model_dir.parent / "mono"
    subset = split_subset(size.data, size.features, size.split, cfg["subset"] or MONO_SUBSET, cfg["subset_by"])
    shards = split_shards(size.data, size.features, size.lang_dir, size.split, size.config["gmm"]["shard_utts"],
                          only=subset, **gmm_features(model_dir))
    model = GmmModel.load(model_dir)
    totals = _aligning_pass(size, client, model, shards, "mono")
    m_step(model, totals, cfg["min_gaussian_occupancy"])
    return {"subset": sum(len(s.utts) for s in shards), "frames": totals.frames, "failed": len(totals.failed)}


def _aligning_pass(size: Size, client: Any, model: GmmModel, shards: list, name: str) -> Any:
    """One E-step of ``model`` that aligns ``shards`` (archives in ``<root>/<name>.parts``), summed on the
    workers."""
    blob = broadcast(client, model.to_bytes())
    return run_reduced(client, estep_task, [(s, None) for s in shards], blob, "realign", size.options(),
                       str(size.root / f"{name}.parts"), combine=merge_results, units=[len(s.utts) for s in shards],
                       desc=f"{name}-{size.hours:.0f}h")


def _realign(size: Size, client: Any) -> dict[str, Any]:
    totals = _aligning_pass(size, client, GmmModel.load(size.model_dir), size.shards(), "realign")
    with open(size.root / "refs.pkl", "wb") as f:
        pickle.dump(totals.alignments, f)
    return {"failed": len(totals.failed)}


def _accumulate(size: Size, client: Any) -> dict[str, Any]:
    model, shards, alignments = GmmModel.load(size.model_dir), size.shards(), size.alignments()
    blob = broadcast(client, model.to_bytes())
    totals = run_reduced(client, estep_task, [(s, shard_alignments(alignments, s.utts)) for s in shards], blob,
                         "accumulate", size.options(), combine=merge_results, units=[len(s.utts) for s in shards],
                         desc=f"accumulate-{size.hours:.0f}h")
    start = time.perf_counter()
    m_step(model, totals, size.config["gmm"]["tri"]["min_gaussian_occupancy"])
    return {"frames": totals.frames, "reduced_mb": round(len(pickle.dumps(totals)) / 2**20, 2),
            "m_step_s": round(time.perf_counter() - start, 2)}


def _tree(size: Size, client: Any) -> dict[str, Any]:
    from asrflow.gmm.train import tree_model

    model = GmmModel.load(size.model_dir)
    _, info = tree_model(size.config, size.config["gmm"]["tri"], size.shards(), size.lang_dir, model,
                         size.alignments(), client, lambda *_: None, "tri")
    return {"leaves": info["leaves"]}


def _fmllr(size: Size, client: Any) -> dict[str, Any]:
    from asrflow.decode.decoder import gmm_decode_options
    from asrflow.gmm.adapt import AdaptOptions, adapt_pass
    from asrflow.gmm.transforms import StoredTransforms

    config, model, shards = size.config, GmmModel.load(size.model_dir), size.shards()
    opts = AdaptOptions(gmm_decode_options(config["decode"]), size.options(), config["fmllr"]["silence_weight"])
    transforms = StoredTransforms(size.root / "transforms")
    adapt_pass(client, shards, size.alignments(), broadcast(client, model.to_bytes()), "", transforms, opts,
               config["fmllr"], {}, f"fmllr-{size.hours:.0f}h", config["dask"]["retries"])
    return {"adapted": len(transforms)}


def _alignments(size: Size, client: Any) -> dict[str, Any]:
    model = GmmModel.load(size.model_dir)
    write_alignments(size.root / "ali", model.tid2pdf, model.tid_tables[0], size.alignments())
    frames = sum(len(ali) for ali in read_alignments(size.root / "ali").values())
    return {"alignments_mb": round(frames * 4 / 2**20, 1)}


def _nnet_read(size: Size, client: Any) -> dict[str, Any]:
    import torch

    from asrflow.config.settings import Training
    from asrflow.nnet.bare import data_path_fps
    from asrflow.nnet.data import FeatureDataset

    dataset = FeatureDataset(size.root / "data", size.root / "features", size.split)
    opts = Training.defaults(max_frames=20000, loader_workers=0, prefetch=2)
    start = time.perf_counter()
    result = data_path_fps(dataset, opts, "hybrid", torch.device("cpu"))
    seconds = time.perf_counter() - start
    return {"frames_per_second": round(sum(dataset.lengths) / max(seconds, 1e-9)),
            "padding": round(result["padding"], 4)}


