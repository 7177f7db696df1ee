"""Unsupervised adaptation of a hybrid network to each test speaker (``type: adapted``).

What Kaldi does for GMMs with fMLLR (a first decoding pass, a transform per test speaker from
its hypotheses, a second pass), done to the network itself: the trained network (``source``)
decodes the test split with its tuned settings; each utterance's best path gives frame targets
(tied states); for each speaker a copy of the network is fine-tuned on its own utterances'
targets for a few epochs at a small rate (``nnet.train`` with :data:`~asrflow.config.schema.ADAPT_TRAIN`
and the network's ``train`` overrides), early-stopped on a held-out part of them, and the
speaker is decoded again with that copy. With ``rounds`` > 1 that pass's best paths become the
targets of the next copy, again fine-tuned from the source. The reference transcripts are never
read.

The held-out loss is measured against first-pass targets too, so it can only tell how well a
copy fits its speaker's hypotheses; as in :func:`asrflow.nnet.train.train` with ``init``, a
copy that never beats the source on it stays the source. The decode's RTF counts both passes
and the fine-tuning.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from asrflow.config import model_cmvn
from asrflow.decode.decoder import DecodeResult
from asrflow.nnet import NnetError

#: Keys of ``final.pt`` that describe the network rather than travel with it as ``extra``
HEADER_KEYS = ("model", "config", "num_classes", "input_dim", "objective")


def first_pass_targets(results: list[DecodeResult], tid2pdf: np.ndarray) -> dict[str, np.ndarray]:
    """Tied-state targets of each utterance whose first pass found words, from its best path's transition ids."""
    return {utt: tid2pdf[ali].astype(np.int64) for r in results for utt, ali in r.alignments.items()
            if r.hyps.get(utt)}


def speakers_of(utts: list[str], utt2spk: dict[str, str]) -> dict[str, list[str]]:
    """``utts`` grouped by speaker, each group sorted, speakers in sorted order."""
    groups: dict[str, list[str]] = {}
    for utt in sorted(utts):
        groups.setdefault(utt2spk[utt], []).append(utt)
    return dict(sorted(groups.items()))


def merged_result(first: list[DecodeResult], second: dict[str, DecodeResult], speakers: dict[str, list[str]],
                  extra_seconds: float) -> DecodeResult:
    """One result for the split: each adapted speaker's second pass, the first pass for the others; the time of
    both passes and of the fine-tuning (``extra_seconds``) over the split's frames."""
    hyps = {utt: words for r in first for utt, words in r.hyps.items()}
    failed = {utt for r in first for utt in r.failed}
    for spk, result in second.items():
        for utt in speakers[spk]:
            failed.discard(utt)
        hyps.update(result.hyps)
        failed.update(result.failed)
    seconds = sum(r.seconds for r in first) + sum(r.seconds for r in second.values()) + extra_seconds
    return DecodeResult(dict(sorted(hyps.items())), sorted(failed), sum(r.frames for r in first), seconds)


def adapt_speaker(config: dict[str, Any], system: str, net_dir: Path, source: dict[str, Any], data_dir: str | Path,
                  feats_dir: str | Path, test: str, utts: list[str], targets: dict[str, np.ndarray],
                  out_dir: Path, log: Callable[[str], None] = print) -> dict[str, Any] | None:
    """Fine-tune ``source`` (the content of ``net_dir``'s ``final.pt``, a hybrid) on one speaker's utterances
    ``utts`` of ``test`` with their first-pass ``targets``; writes ``final.pt`` and the source's ``priors.npy``
    to ``out_dir``. None when fewer than two of its utterances have targets (nothing to hold out)."""
    from asrflow.nnet.data import FeatureDataset
    from asrflow.nnet.stage import held_out, train_options
    from asrflow.nnet.train import train

    usable = [u for u in utts if u in targets]
    if len(usable) < 2:
        return None
    valid = held_out(usable, config["nnet"]["valid_fraction"], config["seed"])
    cmvn = model_cmvn(config, system)
    train_set = FeatureDataset(data_dir, feats_dir, test, targets, utterances=set(usable) - valid, cmvn=cmvn)
    valid_set = FeatureDataset(data_dir, feats_dir, test, targets, utterances=valid, cmvn=cmvn)
    extra = {k: v for k, v in source.items() if k not in HEADER_KEYS}
    summary = train(source["config"], train_options(config, system), train_set, valid_set, source["num_classes"],
                    out_dir, log=log, extra=extra, state_dir=out_dir / "state", init=source)
    shutil.copyfile(net_dir / "priors.npy", out_dir / "priors.npy")
    return {"utterances": len(usable), "held_out": len(valid), "epochs": summary["epochs"],
            "held_out_loss": summary["best_valid_loss"], "seconds": summary["seconds"]}


def decode_adapted(config: dict[str, Any], system: str, net_dir: str | Path, data_dir: str | Path,
                   feats_dir: str | Path, lang_dir: str | Path, test: str, out_dir: str | Path, client: Any,
                   gmm_dir: str | Path | None, graph_dir: str | Path | None, tuned: dict[str, float] | None = None,
                   threads: int | None = None, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Decode ``test`` with adapted network ``system``: a first pass with its source (trained in ``net_dir``),
    a copy of the source fine-tuned per speaker on that pass's best paths, a second pass per speaker.

    Writes ``hyp.txt`` and ``manifest.json`` as any decode, plus ``first_pass.txt`` (the source's
    hypotheses) and ``adaptation.json`` (per speaker: utterances used, held-out loss, epochs,
    seconds, hypotheses changed). The adapted copies are removed once decoded.
    """
    import torch

    from asrflow.data.datadir import read_table
    from asrflow.decode.stage import decode_network, decoder_settings, write_decode, write_hyps
    from asrflow.gmm.model import GmmModel
    from asrflow.gmm.shards import split_shards

    source = config["nnet"]["models"][system]["source"]
    if gmm_dir is None or graph_dir is None:
        raise NnetError(f"adapted network {system!r} needs --gmm and --graph (its source {source!r}'s) to decode")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    shard_utts = config["nnet"]["decode"]["shard_utts"]
    start = time.perf_counter()
    cmvn = model_cmvn(config, system)
    shards = split_shards(data_dir, feats_dir, lang_dir, test, shard_utts, deltas=0, cmvn=cmvn)
    (opts,), per_shard = decode_network(config, source, net_dir, lang_dir, shards, client,
                                        [{**(tuned or {}), "alignments": True}], gmm_dir, graph_dir,
                                        desc=f"first-pass-{system}-{test}")
    first = [r[0] for r in per_shard]
    write_hyps(out / "first_pass.txt", first)
    tid2pdf = GmmModel.load(gmm_dir).tid2pdf
    targets = first_pass_targets(first, tid2pdf)
    speakers = speakers_of([u for s in shards for u in s.utts], read_table(Path(data_dir) / test / "utt2spk"))
    network = torch.load(Path(net_dir) / "final.pt", weights_only=True, map_location="cpu")
    rounds = config["nnet"]["models"][system]["rounds"]
    second: dict[str, DecodeResult] = {}
    report: dict[str, Any] = {}
    tuning = 0.0
    first_hyps = {utt: words for r in first for utt, words in r.hyps.items()}
    for spk, utts in speakers.items():
        work = out / "speakers" / spk
        spk_shards = split_shards(data_dir, feats_dir, lang_dir, test, shard_utts, deltas=0, only=set(utts),
                                  cmvn=cmvn)
        spk_targets, info, result = targets, None, None
        for round_ in range(rounds):  # each round fine-tunes the source on the latest pass's best paths
            if threads:  # a decoding task in this process may have left torch with one thread
                torch.set_num_threads(threads)
            t0 = time.perf_counter()
            shutil.rmtree(work, ignore_errors=True)
            adapted = adapt_speaker(config, system, Path(net_dir), network, data_dir, feats_dir, test, utts,
                                    spk_targets, work, log=lambda m, spk=spk: log(f"{spk}: {m}"))
            tuning += time.perf_counter() - t0
            if adapted is None:
                break
            info = adapted
            more = round_ + 1 < rounds
            _, results = decode_network(config, source, work, lang_dir, spk_shards, client,
                                        [{**(tuned or {}), "alignments": more}], gmm_dir, graph_dir,
                                        desc=f"decode-{system}-{spk}")
            result = merged_result([r[0] for r in results], {}, {}, 0.0)
            if more:
                spk_targets = first_pass_targets([r[0] for r in results], tid2pdf)
        if info is None or result is None:
            log(f"{spk}: fewer than two utterances with first-pass words; the first pass stands")
            report[spk] = {"utterances": sum(u in targets for u in utts), "adapted": False}
            continue
        second[spk] = result
        changed = sum(result.hyps.get(u) != first_hyps.get(u) for u in utts)
        report[spk] = {**info, "adapted": True, "rounds": rounds, "changed": changed}
        log(f"{spk}: adapted on {info['utterances'] - info['held_out']} utterances, {info['held_out']} held out "
            f"({rounds} round(s), last {info['epochs']} epochs, held-out loss {info['held_out_loss']:.4f}); "
            f"{changed} of {len(utts)} hypotheses changed")
    shutil.rmtree(out / "speakers", ignore_errors=True)
    merged = merged_result(first, second, speakers, tuning)
    (out / "adaptation.json").write_text(json.dumps({"source": source, "speakers": report}, indent=2) + "\n")
    settings = {"system": system, "source": source, **decoder_settings(opts), "tuned": bool(tuned),
                "speakers_adapted": sum(r["adapted"] for r in report.values()),
                "hypotheses_changed": sum(r.get("changed", 0) for r in report.values()),
                "adaptation_seconds": round(tuning, 3)}
    return write_decode(out, test, [merged], time.perf_counter() - start, settings, log)
