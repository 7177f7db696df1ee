"""How the GMM stages' cost and memory grow with the corpus: ``asrflow bench scale``.

A training split is replicated to each size asked for (copies of its utterances and speakers
under new ids, pointing at the same stored features, so no audio is read again; each copy of a
speaker is a new speaker) and the stages that grow with the data run once over it, with a trained
system, on a local Dask cluster of the size's own:

- ``realign``: one E-step that aligns every utterance (the workers write the alignments and sum the
  statistics);
- ``accumulate``: one E-step from those alignments;
- ``tree``: tree statistics from the alignments, summed on the workers, and the tree built from them
  (``gmm.tri``'s sizes);
- ``fmllr``: one pass of fMLLR statistics and a transform for every speaker;
- ``alignments``: the alignments written as Kaldi archives (``ali/``) and read back, every one;
- ``nnet_read``: one epoch of the networks' data path (read, CMVN, pad; no model).

Each stage's driver is a process of its own (its peak resident memory is the stage's, not what
earlier stages left behind); the workers serve all the stages of a size, as they serve a training
run. One JSON line per stage and size: ``stage``, ``hours``, ``wall_s``, ``cpu_s`` (driver and
workers), ``wall_s_per_hour``, ``peak_rss_driver_mb``, ``peak_rss_worker_mb`` (the largest
worker's peak so far; none for stages without workers) and the stage's own counts.
"""

from __future__ import annotations

import multiprocessing
import pickle
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asrflow.cluster import broadcast, dask_client, peak_memory, run_reduced
from asrflow.data.datadir import read_table
from asrflow.features.ark import read_scp
from asrflow.gmm.alignments import StoredAlignments, read_alignments, shard_alignments, write_alignments
from asrflow.gmm.estep import AlignOptions
from asrflow.gmm.lda import gmm_features
from asrflow.gmm.model import GmmModel
from asrflow.gmm.shards import split_shards
from asrflow.gmm.train import estep_task
from asrflow.gmm.update import merge_results


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
    return {"utterances": len(lines["text"]), "speakers": len(speakers), "frames": total, "copies": copy}


def _cpu_seconds() -> float:
    """CPU time (user + system) of this process so far."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _cache_mb() -> float:
    """What a worker's caches hold now (MB)."""
    from asrflow.gmm import estep

    return (estep._FEATURES.used + estep._GRAPHS.used) / 2**20


def stage_line(stage: str, hours: float, wall: float, cpu: float, driver_mb: float, worker_mb: float | None,
               **extra: Any) -> dict[str, Any]:
    """One JSON line of the scale benchmark: a stage at a corpus size (the keys every stage shares)."""
    return {"stage": stage, "hours": round(hours, 2), "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
            "wall_s_per_hour": round(wall / max(hours, 1e-9), 3), "peak_rss_driver_mb": round(driver_mb, 1),
            "peak_rss_worker_mb": None if worker_mb is None else round(worker_mb, 1), **extra}


@dataclass(frozen=True)
class Size:
    """One size of the benchmark: the replicated split in ``root`` and what its stages need."""

    config: dict[str, Any]
    root: Path
    lang_dir: Path
    model_dir: Path
    split: str
    hours: float

    def shards(self) -> list:
        return split_shards(self.root / "data", self.root / "features", self.lang_dir, self.split,
                            self.config["gmm"]["shard_utts"], **gmm_features(self.model_dir))

    def options(self) -> AlignOptions:
        cfg = self.config["gmm"]["mono"]
        return AlignOptions(beam=cfg["beam"], retry_beam=cfg["retry_beam"])

    def alignments(self) -> StoredAlignments:
        """The realign stage's alignments (where each is)."""
        with open(self.root / "refs.pkl", "rb") as f:
            return StoredAlignments(pickle.load(f))


def _realign(size: Size, client: Any) -> dict[str, Any]:
    model, shards = GmmModel.load(size.model_dir), size.shards()
    blob = broadcast(client, model.to_bytes())
    totals = run_reduced(client, estep_task, [(s, None) for s in shards], blob, "realign", size.options(),
                         str(size.root / "ali.parts"), combine=merge_results, units=[len(s.utts) for s in shards],
                         desc=f"realign-{size.hours:.0f}h")
    with open(size.root / "refs.pkl", "wb") as f:
        pickle.dump(totals.alignments, f)
    return {"failed": len(totals.failed)}


def _accumulate(size: Size, client: Any) -> dict[str, Any]:
    model, shards, alignments = GmmModel.load(size.model_dir), size.shards(), size.alignments()
    blob = broadcast(client, model.to_bytes())
    totals = run_reduced(client, estep_task, [(s, shard_alignments(alignments, s.utts)) for s in shards], blob,
                         "accumulate", size.options(), combine=merge_results, units=[len(s.utts) for s in shards],
                         desc=f"accumulate-{size.hours:.0f}h")
    return {"frames": totals.frames, "reduced_mb": round(len(pickle.dumps(totals)) / 2**20, 2)}


def _tree(size: Size, client: Any) -> dict[str, Any]:
    from asrflow.gmm.train import tree_model

    model = GmmModel.load(size.model_dir)
    _, info = tree_model(size.config, size.config["gmm"]["tri"], size.shards(), size.lang_dir, model,
                         size.alignments(), client, lambda *_: None, "tri")
    return {"leaves": info["leaves"]}


def _fmllr(size: Size, client: Any) -> dict[str, Any]:
    from asrflow.decode.decoder import gmm_decode_options
    from asrflow.gmm.adapt import AdaptOptions, adapt_pass

    config, model, shards = size.config, GmmModel.load(size.model_dir), size.shards()
    opts = AdaptOptions(gmm_decode_options(config["decode"]), size.options(), config["fmllr"]["silence_weight"])
    transforms: dict = {}
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


#: The stages in the order they run, each with whether it uses the workers.
STAGES: dict[str, tuple[Callable[[Size, Any], dict[str, Any]], bool]] = {
    "realign": (_realign, True), "accumulate": (_accumulate, True), "tree": (_tree, True), "fmllr": (_fmllr, True),
    "alignments": (_alignments, False), "nnet_read": (_nnet_read, False)}


#: The stages that read the realign stage's alignments (it runs first when they are asked for).
NEED_ALIGNMENTS = {"accumulate", "tree", "fmllr", "alignments"}


def _run_stage(name: str, size: Size, address: str) -> dict[str, Any]:
    """Stage ``name`` in this (fresh) process, its driver, on the cluster at ``address``: its JSON line."""
    from dask.distributed import Client

    fn, uses_workers = STAGES[name]
    with Client(address, timeout="60s") as client:
        workers_cpu = sum(client.run(_cpu_seconds).values())
        cpu = _cpu_seconds()
        start = time.perf_counter()
        extra = fn(size, client if uses_workers else None)
        wall = time.perf_counter() - start
        cpu = _cpu_seconds() - cpu + (sum(client.run(_cpu_seconds).values()) - workers_cpu if uses_workers else 0)
        peaks = peak_memory(client)  # this process's, and the largest worker's
        if uses_workers:
            extra["worker_cache_mb"] = round(max(client.run(_cache_mb).values()), 1)
    return stage_line(name, size.hours, wall, cpu, peaks["peak_rss_driver_mb"],
                      peaks["peak_rss_worker_mb"] if uses_workers else None, **extra)


def _one_size(config: dict[str, Any], data_dir: Path, feats_dir: Path, lang_dir: Path, model_dir: Path,
              split: str, target: float, workers: int, stages: list[str], log: Callable[[str], None]) -> list[dict]:
    """The benchmark at one size: the split replicated, a cluster started, each stage's driver a fresh process."""
    spawn = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="asrflow-scale-") as tmp:
        root = Path(tmp)
        counts = replicate(data_dir, feats_dir, split, target, root)
        size = Size(config, root, lang_dir, model_dir, split, counts["frames"] / 360_000)
        dask_cfg = {**config["dask"], "workers": workers, "dashboard": False, "single_worker_thread": False}
        lines = []
        with dask_client(dask_cfg, log=lambda *_: None) as client:
            for name in stages:
                with ProcessPoolExecutor(1, mp_context=spawn) as pool:
                    line = pool.submit(_run_stage, name, size, client.scheduler.address).result()
                line.update(workers=workers, utterances=counts["utterances"], speakers=counts["speakers"])
                log(f"{line['hours']} h {name}: {line['wall_s']} s, driver {line['peak_rss_driver_mb']} MB, "
                    f"worker {line['peak_rss_worker_mb']} MB")
                lines.append(line)
    return lines


def scale_benchmark(config: dict[str, Any], data_dir: str | Path, feats_dir: str | Path, lang_dir: str | Path,
                    model_dir: str | Path, split: str, hours: list[float], workers: int, log=print,
                    stages: list[str] | None = None) -> list[dict]:
    """The stages (:data:`STAGES`, or those named, in their order; ``realign`` too when one of them reads its
    alignments) of the system in ``model_dir`` over ``split`` replicated to each of ``hours``, on a fresh local
    cluster of ``workers`` processes per size: one line per stage and size."""
    names = list(STAGES) if stages is None else [n for n in STAGES if n in stages]
    unknown = [n for n in (stages or []) if n not in STAGES]
    if unknown:
        raise ValueError(f"unknown stages {', '.join(unknown)}: {', '.join(STAGES)}")
    if set(names) & NEED_ALIGNMENTS and "realign" not in names:  # their alignments come from realign
        names.insert(0, "realign")
    lines: list[dict] = []
    for target in hours:
        lines += _one_size(config, Path(data_dir), Path(feats_dir), Path(lang_dir), Path(model_dir), split, target,
                           workers, names, log)
    return lines
