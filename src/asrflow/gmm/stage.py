"""The gmm stage: train one system (``mono``, ``tri``, ``lda`` or ``sat``) on a training split and write it out.

Output folder (``results/<exp>/gmm/<train split>/<system>/``)::

    final.mdl.pkl  tree          the model (tree also in Kaldi's binary format)
    final.mat  splice_opts       lda and sat: the LDA+MLLT projection of spliced frames (Kaldi's formats)
    ali/                         forced alignment of every training utterance: transition ids, pdf ids and
                                 phone ids per frame (Kaldi int32 archives, :mod:`asrflow.gmm.alignments`)
    report.tsv                   utterances that could not be aligned, and why
    alignment.png                one alignment drawn over its spectrogram
    manifest.json                pdfs, Gaussians, iterations, timing, log-likelihood

:func:`align_split` (the align stage, ``results/<exp>/align/<train split>/<system>/``) writes
the same ``ali/``, ``report.tsv`` and a ``manifest.json`` for another split aligned with a
trained system: ``<train>_sp``, the speed-perturbed copies.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from asrflow.config import SAT_SOURCES
from asrflow.config.paths import Paths
from asrflow.data.datadir import read_data_dir, read_table
from asrflow.data.holdout import held_out_utterances
from asrflow.features import Projection
from asrflow.gmm.alignments import StoredAlignments, read_alignments, shard_alignments, write_alignments
from asrflow.gmm.estep import AlignOptions
from asrflow.gmm.lda import gmm_features
from asrflow.gmm.model import GmmModel
from asrflow.gmm.resume import GmmState
from asrflow.gmm.shards import split_shards, split_subset
from asrflow.gmm.train import TrainResult, align_shards, train_lda, train_mono, train_tri
from asrflow.lang.graph import read_symbols


def save_alignments(folder: Path, model: GmmModel, alignments: Mapping[str, np.ndarray]) -> None:
    """Transition ids, pdf ids and phone ids per frame of every utterance (:mod:`asrflow.gmm.alignments`)."""
    phone_of, _ = model.tid_tables
    write_alignments(folder, model.tid2pdf, phone_of, alignments)


def spectrogram(audio: str, sample_rate: int, start: float | None = None, end: float | None = None) -> np.ndarray:
    """Log power spectrogram (dB, peak at 0, floor 80 dB below) with Kaldi's framing.

    25 ms Hann windows every 10 ms, no padding (``snip_edges``), zero-padded to a power of two
    for the FFT: librosa's ``power_to_db(|stft(center=False)|**2, ref=max, top_db=80)``, in
    numpy so that drawing one alignment does not import librosa. Shape: (bins, frames).
    """
    from asrflow.data.audio import read_audio, resample

    samples, rate = read_audio(audio, start, end)
    samples = resample(samples, rate, sample_rate).astype(np.float64)
    win, hop = int(0.025 * sample_rate), int(0.01 * sample_rate)
    n_fft = 1 << (win - 1).bit_length()
    if len(samples) < n_fft:
        samples = np.pad(samples, (0, n_fft - len(samples)))
    frames = np.lib.stride_tricks.sliding_window_view(samples, n_fft)[::hop]
    left = (n_fft - win) // 2  # the window sits in the middle of the FFT frame, as in librosa
    window = np.zeros(n_fft)
    window[left:left + win] = np.hanning(win + 1)[:-1]  # periodic Hann
    power = np.abs(np.fft.rfft(frames * window, axis=1)).T ** 2
    db = 10.0 * np.log10(np.maximum(power, 1e-10)) - 10.0 * np.log10(max(power.max(), 1e-10))
    return np.maximum(db, db.max() - 80.0)


def plot_alignment(path: Path, image: np.ndarray, phones: list[str], utt: str, sample_rate: int) -> None:
    """Draw one utterance's frame-level phone alignment over its spectrogram."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 3.5))
    ax.imshow(image, aspect="auto", origin="lower", cmap="magma",
              extent=(0, image.shape[1], 0, sample_rate / 2000))
    top = sample_rate / 2000
    start = 0
    for t in range(1, len(phones) + 1):
        if t == len(phones) or phones[t] != phones[start]:
            ax.axvline(start, color="cyan", linewidth=0.8)
            ax.text((start + t) / 2, top * 0.92, phones[start], color="white", ha="center", fontsize=8)
            start = t
    ax.set_title(f"{utt}: forced alignment (phones) over the spectrogram")
    ax.set_xlabel("frame (10 ms)")
    ax.set_ylabel("kHz")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_report(path: Path, failed: dict[str, str]) -> None:
    """``utt_id<TAB>reason`` of every utterance that could not be aligned."""
    path.write_text("utt_id\treason\n" + "".join(f"{u}\t{r}\n" for u, r in sorted(failed.items())))


def align_split(config: dict[str, Any], system: str, model_dir: str | Path, split: str, data_dir: str | Path,
                feats_dir: str | Path, lang_dir: str | Path, out_dir: str | Path, client: Any,
                log=print) -> dict[str, Any]:
    """Force-align every utterance of ``split`` with a trained system (Kaldi ``align_si.sh``) into ``out_dir``.

    Writes ``ali/`` (as the gmm stage does), ``report.tsv`` (utterances not aligned, and
    why) and ``manifest.json``. Used for the speed-perturbed copies of a training split,
    which the system was not trained on. ``feats_dir``: the MFCCs, or for a speaker-adaptively
    trained system the copies' features adapted by its source's transforms (which it was trained
    on; Kaldi's ``align_fmllr.sh`` then re-estimates them, as the fmllr stage does after).
    """
    start = time.perf_counter()
    out, lang_dir = Path(out_dir), Path(lang_dir)
    out.mkdir(parents=True, exist_ok=True)
    model = GmmModel.load(model_dir)
    cfg = config["gmm"][system]
    shards = split_shards(data_dir, feats_dir, lang_dir, split, config["gmm"]["shard_utts"],
                          **gmm_features(model_dir, adapted=system in SAT_SOURCES))
    parts = out / "ali.parts"  # the workers' archives, until ali/ is written from them
    refs, failed, results = align_shards(client, shards, model,
                                         AlignOptions(beam=cfg["beam"], retry_beam=cfg["retry_beam"]),
                                         config["dask"]["retries"], f"align-{split}", parts)
    alignments = StoredAlignments(refs)
    save_alignments(out / "ali", model, alignments)
    shutil.rmtree(parts, ignore_errors=True)
    write_report(out / "report.tsv", failed)
    frames = sum(r.aligned_frames for r in results)
    manifest = {"system": system, "split": split, "utterances": sum(len(s.utts) for s in shards),
                "aligned": len(alignments), "failed": len(failed), "retried": sum(r.retried for r in results),
                "loglike_per_frame": round(sum(r.align_like for r in results) / max(frames, 1), 4),
                "seconds": round(time.perf_counter() - start, 3)}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    log(f"{system}: aligned {manifest['aligned']} of {manifest['utterances']} utterances of {split}, "
        f"{manifest['failed']} failed, {manifest['retried']} retried, {manifest['seconds']:.1f} s")
    return manifest


def build_chain(config: dict[str, Any], source_dir: str | Path, alignments_dir: str | Path, split: str,
                data_dir: str | Path, feats_dir: str | Path, lang_dir: str | Path, out_dir: str | Path, client: Any,
                log=print) -> dict[str, Any]:
    """The chain models' tree and alignments (``nnet.chain``; :mod:`asrflow.gmm.chain`) into ``out_dir``.

    ``source_dir``: the GMM system ``nnet.chain.source``; ``alignments_dir``: its alignments of ``split`` (its
    own folder, or the align stage's folder of the speed-perturbed copies), over the features it reads from
    ``feats_dir``. Writes the model (``final.mdl.pkl``, ``tree``: the chain topology, one Gaussian per leaf),
    ``ali/`` (every alignment converted, at one frame in ``frame_subsampling``), ``report.tsv`` (those that
    could not be) and ``manifest.json``, as the gmm stage does.
    """
    from asrflow.cluster import broadcast, run_reduced
    from asrflow.gmm.chain import ChainAlignments
    from asrflow.gmm.model import topology_from_text
    from asrflow.gmm.train import _merge_tree_stats, _tree_stats_args, tree_from_stats
    from asrflow.lang.symbols import chain_topology_text

    start = time.perf_counter()
    cfg = config["nnet"]["chain"]
    factor = cfg["frame_subsampling"]
    out, lang_dir = Path(out_dir), Path(lang_dir)
    out.mkdir(parents=True, exist_ok=True)
    source = GmmModel.load(source_dir)
    alignments = read_alignments(Path(alignments_dir) / "ali")
    shards = split_shards(data_dir, feats_dir, lang_dir, split, config["gmm"]["shard_utts"], only=set(alignments),
                          **gmm_features(source_dir, adapted=cfg["source"] in SAT_SOURCES))
    per_shard = [shard_alignments(alignments, s.utts) for s in shards]
    stats = run_reduced(client, _tree_stats_args, list(zip(shards, per_shard)), broadcast(client, source.to_bytes()),
                        factor, combine=_merge_tree_stats, units=[len(s.utts) for s in shards], desc="tree-stats",
                        retries=config["dask"]["retries"])
    if stats is None:
        raise ValueError(f"{alignments_dir}: no alignment of {split} can be kept at one frame in {factor}")
    phones = [int(x) for name in ("silence.int", "nonsilence.int") for x in (lang_dir / name).read_text().split()]
    model, info = tree_from_stats(stats, lang_dir, topology_from_text(chain_topology_text(phones)), cfg, log, "chain")
    converter = ChainAlignments(source, model, factor)
    converted, failed = {}, {}
    for utt, alignment in alignments.items():
        if (tids := converter.convert(alignment)) is None:
            failed[utt] = f"a phone of the {cfg['source']} alignment is shorter than {factor} frames"
        else:
            converted[utt] = tids
    model.save(out)
    save_alignments(out / "ali", model, converted)
    write_report(out / "report.tsv", failed)
    manifest = {"system": "chain", "source": cfg["source"], "split": split, "frame_subsampling": factor,
                "pdfs": model.am.num_pdfs, **info, "converted": len(converted), "failed": len(failed),
                "seconds": round(time.perf_counter() - start, 3)}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    log(f"chain: {manifest['pdfs']} pdfs at one frame in {factor}, {len(converted)} alignments of {split} "
        f"converted, {len(failed)} not, {manifest['seconds']:.1f} s")
    return manifest


def _train_mono(config: dict[str, Any], shards: list, paths: Paths, train: str, only: set[str] | None,
                client: Any, on_metrics: Any, log: Any, state: GmmState) -> tuple[TrainResult, int]:
    """The monophone on ``shards`` (the utterances ``only``, or all) or, with ``gmm.mono.subset``, on that many of
    them, then all of them aligned with it for the next system (``align_si.sh``); the result and how many it
    trained on."""
    cfg = config["gmm"]["mono"]
    subset = (split_subset(paths.data, paths.features, train, cfg["subset"], cfg["subset_by"], only=only)
              if cfg["subset"] else None)
    if subset is None:
        return (train_mono(config, shards, paths.lang, client, on_metrics, log, state),
                sum(len(s.utts) for s in shards))
    few = split_shards(paths.data, paths.features, paths.lang, train, config["gmm"]["shard_utts"], only=subset)
    result = train_mono(config, few, paths.lang, client, on_metrics, log, state)
    _align_more(config, "mono", result, shards, train, client, state)
    log(f"mono: trained on {len(subset)} utterances ({cfg['subset_by']}), aligned {len(result.alignments)} of "
        f"{sum(len(s.utts) for s in shards)}")
    return result, len(subset)


def _align_more(config: dict[str, Any], system: str, result: TrainResult, shards: list, split: str,
                client: Any, state: GmmState) -> None:
    """Align the utterances of ``shards`` with the trained ``result.model`` (``align_si.sh``; archives in
    ``state``'s folder) and add them to its alignments and failures, and the time to its seconds."""
    if not shards:
        return
    cfg = config["gmm"][system]
    start = time.perf_counter()
    alignments, failed, _ = align_shards(client, shards, result.model,
                                         AlignOptions(beam=cfg["beam"], retry_beam=cfg["retry_beam"]),
                                         config["dask"]["retries"], f"align-{split}", state.archives("ali.more"))
    result.alignments.update(alignments)
    result.failed = {u: r for u, r in {**result.failed, **failed}.items() if u not in alignments}
    result.seconds += time.perf_counter() - start


def state_identity(config: dict[str, Any], system: str, shards: list, feats_dir: str | Path, train: str,
                   source: GmmModel | None = None) -> str:
    """What a saved training state must match to be resumed: the system's settings, the seed, the training
    shards (their utterances and feature offsets), when the features were written, and the source model."""
    scp = Path(feats_dir) / train / "feats.scp"
    parts = (system, json.dumps(config["gmm"][system], sort_keys=True), config["seed"], config["gmm"]["shard_utts"],
             [s.key for s in shards], scp.stat().st_mtime_ns if scp.is_file() else None,
             hashlib.sha1(source.to_bytes()).hexdigest() if source is not None else None)
    return hashlib.sha1(repr(parts).encode()).hexdigest()


def train_system(config: dict[str, Any], system: str, train: str, data_dir: str | Path, feats_dir: str | Path,
                 lang_dir: str | Path, out_dir: str | Path, client: Any, run: Any,
                 source_dir: str | Path | None = None, state_dir: str | Path | None = None,
                 log=print) -> dict[str, Any]:
    """Train ``system`` on split ``train`` and write the output folder; returns the manifest.

    ``feats_dir``: the MFCCs (CMVN and Δ+ΔΔ or the LDA+MLLT projection applied here), or for a
    speaker-adaptively trained system (:data:`~asrflow.config.SAT_SOURCES`) the fmllr stage's
    adapted features, used as they are. ``source_dir``: the system whose alignments build the tree
    (tri: mono; lda: tri; sat: lda). ``state_dir``: where the training progress is saved after every
    iteration, so that a rerun after a failure goes on from there (:mod:`asrflow.gmm.resume`), and the
    workers' alignment archives (default: ``out_dir/.state``, removed at the end).
    """
    out, lang_dir = Path(out_dir), Path(lang_dir)
    out.mkdir(parents=True, exist_ok=True)
    state_dir = out / ".state" if state_dir is None else state_dir  # where the workers can write
    shard_utts = config["gmm"]["shard_utts"]

    def on_metrics(step: int, metrics: dict[str, float]) -> None:
        run.log_metrics({f"{system}.{k}": v for k, v in metrics.items()}, step=step)

    # the networks' held-out utterances left out of training (gmm.hold_out), aligned after it
    held = held_out_utterances(config, data_dir, train) if config["gmm"]["hold_out"] else set()
    only = set(read_table(Path(data_dir) / train / "text")) - held if held else None
    # lda splices the static MFCCs itself; sat reads adapted features as they are
    deltas = 0 if system in ("lda", *SAT_SOURCES) else 2

    def shards_of(utts: set[str] | None, projection: Projection | None = None) -> list:
        return split_shards(data_dir, feats_dir, lang_dir, train, shard_utts, deltas=deltas, projection=projection,
                            only=utts)

    def shards_through(projection: Projection | None) -> list:
        return shards_of(only, projection)

    shards = shards_of(only)
    trained_on = sum(len(s.utts) for s in shards)
    if system == "mono":
        state = GmmState(state_dir, state_identity(config, system, shards, feats_dir, train), log)
        result, trained_on = _train_mono(config, shards, Paths(out, Path(data_dir), Path(feats_dir), lang_dir), train,
                                         only, client, on_metrics, log, state)
    else:
        if source_dir is None:
            raise ValueError(f"the {system} system needs the folder of the system whose alignments start it")
        source = GmmModel.load(source_dir)
        source_ali = read_alignments(Path(source_dir) / "ali")
        state = GmmState(state_dir, state_identity(config, system, shards, feats_dir, train, source), log)
        if system == "lda":
            result = train_lda(config, shards_through, lang_dir, source, source_ali, client, on_metrics, log, state)
        else:
            result = train_tri(config, shards, lang_dir, source, source_ali, client, on_metrics, log, system=system,
                               state=state)
        if system in SAT_SOURCES:  # its unadapted features are its source's (the fmllr stage adapts them)
            result.projection = Projection.load(source_dir)
    if held:  # the held-out utterances aligned for the networks' validation (sat's projection is its source's)
        _align_more(config, system, result, shards_of(held, result.projection if system == "lda" else None), train,
                    client, state)
    result.model.save(out)
    if result.projection is not None:
        result.projection.save(out)
    save_alignments(out / "ali", result.model, result.alignments)
    write_report(out / "report.tsv", result.failed)
    if result.alignments:
        utt = min(result.alignments)
        wav = next(u for u in read_data_dir(Path(data_dir) / train) if u.utt_id == utt)
        id2phone = {i: p for p, i in read_symbols(lang_dir / "phones.txt").items()}
        phone_of, _ = result.model.tid_tables
        rate = config["audio"]["sample_rate"]
        plot_alignment(out / "alignment.png", spectrogram(wav.audio, rate, wav.start, wav.end),
                       [id2phone[int(p)] for p in phone_of[result.alignments[utt]]], utt, rate)
    manifest = {"system": system, "train": train, "pdfs": result.model.am.num_pdfs,
                "gaussians": result.model.am.num_gauss, "iterations": result.iterations,
                # means, variances and weights of every Gaussian
                "parameters": result.model.am.num_gauss * (2 * result.model.am.dim + 1),
                "aligned": len(result.alignments), "failed": len(result.failed),
                "seconds": round(result.seconds, 3),
                "utterances": sum(len(s.utts) for s in shards) + len(held),
                "trained_on": trained_on, "held_out": len(held), **result.info}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    state.finish()
    log(f"{system}: {manifest['pdfs']} pdfs, {manifest['gaussians']} Gaussians, {manifest['aligned']} aligned, "
        f"{manifest['failed']} failed, {manifest['seconds']:.1f} s")
    return manifest
