"""The graph and decode stages: HCLG for a trained system (TLG for phone CTC), then 1-best decoding of a test split."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from asrflow.cluster import broadcast, run_sharded
from asrflow.config import model_cmvn
from asrflow.config.paths import Paths
from asrflow.config.settings import decoder_kind, decoding
from asrflow.decode.decoder import DecodeOptions, DecodeResult, decode_shard_settings, gmm_decode_options, rtf
from asrflow.gmm.model import GmmModel
from asrflow.gmm.shards import split_shards
from asrflow.kaldi import kfst
from asrflow.lang.graph import make_hclg, make_tlg


def make_graph(lang_dir: str | Path, model_dir: str | Path | None, out_dir: str | Path, log=print) -> dict[str, Any]:
    """Write ``HCLG.fst`` for the GMM in ``model_dir``, or ``TLG.fst`` (``model_dir`` None) for CTC
    networks over the lang's non-silence phones; ``words.txt`` beside it."""
    lang_dir, out = Path(lang_dir), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()

    def ints(name: str) -> list[int]:
        return [int(x) for x in (lang_dir / name).read_text().split()]

    lexicon = kfst.StdVectorFst.read(str(lang_dir / "L_disambig.fst"))
    grammar = kfst.StdVectorFst.read(str(lang_dir / "G.fst"))
    if model_dir is None:
        name = "TLG"
        graph = make_tlg(lexicon, grammar, ints("nonsilence.int"), ints("disambig.int"), ints("silence.int"))
    else:
        name, model = "HCLG", GmmModel.load(model_dir)
        graph = make_hclg(lexicon, grammar, model.tree, model.tm, ints("disambig.int"),
                          self_loop_scale=model.self_loop_scale)
    graph.write(str(out / f"{name}.fst"))
    (out / "words.txt").write_text((lang_dir / "words.txt").read_text())
    info = {"states": graph.num_states, "seconds": round(time.perf_counter() - start, 3)}
    (out / "manifest.json").write_text(json.dumps(info, indent=2) + "\n")
    log(f"{name}: {info['states']} states in {info['seconds']} s")
    return info


def decode_split(config: dict[str, Any], model_dir: str | Path, graph_dir: str | Path, data_dir: str | Path,
                 feats_dir: str | Path, lang_dir: str | Path, test: str, out_dir: str | Path, client: Any,
                 adapted: bool = False, tuned: dict[str, float] | None = None, log=print) -> dict[str, Any]:
    """Decode split ``test``; write ``hyp.txt`` (words) and ``manifest.json`` (RTF, failures).

    ``adapted``: ``feats_dir`` holds fMLLR-adapted features, used as they are (else the model's own
    transform of the MFCCs, :func:`~asrflow.gmm.lda.gmm_features`). ``tuned`` (from the tune stage)
    replaces the configured acoustic scale and insertion penalty."""
    from asrflow.gmm.lda import gmm_features

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    shards = split_shards(data_dir, feats_dir, lang_dir, test, config["decode"]["shard_utts"],
                          **gmm_features(model_dir, adapted))
    start = time.perf_counter()
    (opts,), per_shard = decode_gmm(config, model_dir, graph_dir, shards, client, [tuned or {}], desc=f"decode-{test}")
    return write_decode(out, test, [r[0] for r in per_shard], time.perf_counter() - start,
                        {"acoustic_scale": opts.acoustic_scale, "beam": opts.beam,
                         "insertion_penalty": opts.insertion_penalty, "tuned": bool(tuned)}, log)


def decode_gmm(config: dict[str, Any], model_dir: str | Path, graph_dir: str | Path, shards: list, client: Any,
               overrides: list[dict[str, float]], desc: str = "decode",
               keep: bool = False) -> tuple[list[DecodeOptions], list[list[DecodeResult]]]:
    """Decode ``shards`` with the GMM in ``model_dir`` through its HCLG once per entry of ``overrides`` (laid
    over the ``decode`` section). Returns the options of each setting and, per shard, one result per setting.
    ``keep``: the workers keep each shard's log-likelihoods for the next call with the same shards (a tuning
    search's steps; :func:`~asrflow.decode.decoder.kept_scores`)."""
    from dataclasses import replace

    settings = [replace(gmm_decode_options(config["decode"]), **o) for o in overrides]
    blob = broadcast(client, GmmModel.load(model_dir).to_bytes())
    graph_path = str(Path(graph_dir).resolve() / "HCLG.fst")
    results = run_sharded(client, decode_shard_settings, shards, blob, graph_path, settings, keep=keep,
                          units=[len(s.utts) for s in shards], desc=desc, retries=config["dask"]["retries"])
    return settings, results


def write_hyps(path: Path, results: list[DecodeResult]) -> None:
    """The results' hypotheses, one ``utt words`` line each."""
    with open(path, "w", encoding="utf-8") as hyp:
        for r in results:
            for utt, words in r.hyps.items():
                hyp.write(f"{utt} {' '.join(words)}".rstrip() + "\n")


def decoder_settings(opts: Any) -> dict[str, Any]:
    """The settings a network decode was run with, for its manifest (a hybrid's or TLG's acoustic scale and
    penalty, a prefix search's LM weight and bonus; beam and active states)."""
    keys = ("acoustic_scale", "insertion_penalty", "beam", "max_active", "lm_weight", "word_bonus")
    return {k: getattr(opts, k) for k in keys if hasattr(opts, k)}


def write_decode(out: Path, test: str, results: list[DecodeResult], wall: float, settings: dict[str, Any],
                 log=print) -> dict[str, Any]:
    """Write ``hyp.txt`` (:func:`write_hyps`) and ``manifest.json`` (RTF, failures, utterances whose search
    reached no final state and kept its best partial path, settings)."""
    write_hyps(out / "hyp.txt", results)
    info = {"test": test, "utterances": sum(len(r.hyps) for r in results), "frames": sum(r.frames for r in results),
            "failed": sorted(u for r in results for u in r.failed),
            "partial": sorted(u for r in results for u in r.partial), "rtf": rtf(results),
            "wall_seconds": round(wall, 3), **settings}
    (out / "manifest.json").write_text(json.dumps(info, indent=2) + "\n")
    log(f"decoded {info['utterances']} utterances of {test}: RTF {info['rtf']:.4f} (one core per task); "
        f"{len(info['failed'])} failed, {len(info['partial'])} reached no final state (best partial path kept)")
    return info


def decode_network(config: dict[str, Any], system: str, net_dir: str | Path, lang_dir: str | Path,
                   shards: list, client: Any, overrides: list[dict[str, float]],
                   gmm_dir: str | Path | None = None, graph_dir: str | Path | None = None,
                   desc: str = "decode", keep: bool = False) -> tuple[list[Any], list[list[DecodeResult]]]:
    """Decode ``shards`` with network ``system`` once per entry of ``overrides`` (laid over ``nnet.decode``).

    Hybrids go through the GMM's HCLG, CTC networks over phones through TLG (``graph_dir``),
    other CTC networks through prefix beam search. Returns the options of each setting and,
    per shard, one result per setting (one forward pass each). ``keep``: the workers keep each
    shard's log posteriors for the next call with the same shards (a tuning search's steps;
    :meth:`~asrflow.nnet.inference.Scoring.shard_log_posteriors`).
    """
    from dataclasses import replace

    from asrflow.decode import ctc
    from asrflow.nnet import NnetError, hybrid
    from asrflow.nnet.inference import Scoring

    dcfg = decoding(config, system)
    network = Scoring(str(Path(net_dir).resolve() / "final.pt"), dcfg.frame_skip, dcfg.batch_frames, dcfg.device,
                      keep, dcfg.precision)
    units = [len(s.utts) for s in shards]
    if config["nnet"]["models"][system]["objective"] == "hybrid":
        if gmm_dir is None or graph_dir is None:
            raise NnetError(f"hybrid network {system!r} needs --gmm and --graph to decode")
        settings = [replace(hybrid.decode_options(dcfg, config["decode"]), **o) for o in overrides]
        priors = np.load(Path(net_dir) / "priors.npy")
        blob = broadcast(client, GmmModel.load(gmm_dir).to_bytes())
        graph_path = str(Path(graph_dir).resolve() / "HCLG.fst")
        results = run_sharded(client, hybrid.decode_shard_settings, shards, network, priors, blob, graph_path,
                              settings, units=units, desc=desc, retries=config["dask"]["retries"])
    elif decoder_kind(config["nnet"]["models"][system]) == "tlg":
        if graph_dir is None:
            raise NnetError(f"CTC network {system!r} over phones needs --graph (its TLG folder) to decode")
        settings = [replace(ctc.graph_options(dcfg, config["decode"]), **o) for o in overrides]
        graph_path = str(Path(graph_dir).resolve() / "TLG.fst")
        results = run_sharded(client, ctc.decode_shard_graph_settings, shards, network, graph_path, settings,
                              units=units, desc=desc, retries=config["dask"]["retries"])
    else:
        settings = [replace(ctc.search_options(dcfg), **o) for o in overrides]
        lm = str(Path(lang_dir).resolve() / "lm.arpa")
        results = run_sharded(client, ctc.decode_shard_settings, shards, network, lm, settings,
                              units=units, desc=desc, retries=config["dask"]["retries"])
    return settings, results


def decode_split_nnet(config: dict[str, Any], system: str, test: str, paths: Paths, client: Any,
                      tuned: dict[str, float] | None = None, log=print) -> dict[str, Any]:
    """Decode split ``test`` with network ``system`` trained in ``paths.model`` into ``paths.out`` (see
    :func:`decode_network` for how each kind is searched; hybrids read ``paths.gmm`` and ``paths.graph``).

    ``tuned`` (from the tune stage) replaces the configured acoustic scale and insertion penalty,
    or LM weight and word bonus.
    """
    paths.out.mkdir(parents=True, exist_ok=True)
    shards = split_shards(paths.data, paths.features, paths.lang, test, config["nnet"]["decode"]["shard_utts"],
                          deltas=0, cmvn=model_cmvn(config, system))
    start = time.perf_counter()
    (opts,), per_shard = decode_network(config, system, paths.model, paths.lang, shards, client, [tuned or {}],
                                        paths.gmm, paths.graph, desc=f"decode-{system}-{test}")
    return write_decode(paths.out, test, [r[0] for r in per_shard], time.perf_counter() - start,
                        {"system": system, **decoder_settings(opts), "tuned": bool(tuned),
                         **({"graph": str(paths.graph)} if paths.graph is not None else {})}, log)
