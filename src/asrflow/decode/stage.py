"""The graph and decode stages: HCLG for a trained system, then 1-best decoding of a test split."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from asrflow.cluster import broadcast, run_sharded
from asrflow.decode.decoder import DecodeOptions, DecodeResult, decode_shard, rtf
from asrflow.gmm.model import GmmModel
from asrflow.gmm.shards import split_shards
from asrflow.kaldi import kfst
from asrflow.lang.graph import make_hclg


def make_graph(lang_dir: str | Path, model_dir: str | Path, out_dir: str | Path, log=print) -> dict[str, Any]:
    """Write ``HCLG.fst`` (and ``words.txt``) for the model in ``model_dir``."""
    lang_dir, out = Path(lang_dir), Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    model = GmmModel.load(model_dir)
    disambig = [int(x) for x in (lang_dir / "disambig.int").read_text().split()]
    lexicon = kfst.StdVectorFst.read(str(lang_dir / "L_disambig.fst"))
    grammar = kfst.StdVectorFst.read(str(lang_dir / "G.fst"))
    hclg = make_hclg(lexicon, grammar, model.tree, model.tm, disambig)
    hclg.write(str(out / "HCLG.fst"))
    (out / "words.txt").write_text((lang_dir / "words.txt").read_text())
    info = {"states": hclg.num_states, "seconds": round(time.perf_counter() - start, 3)}
    (out / "manifest.json").write_text(json.dumps(info, indent=2) + "\n")
    log(f"HCLG: {info['states']} states in {info['seconds']} s")
    return info


def decode_split(config: dict[str, Any], model_dir: str | Path, graph_dir: str | Path, data_dir: str | Path,
                 feats_dir: str | Path, lang_dir: str | Path, test: str, out_dir: str | Path, client: Any,
                 log=print) -> dict[str, Any]:
    """Decode split ``test``; write ``hyp.txt`` (words) and ``manifest.json`` (RTF, failures)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dcfg = config["decode"]
    opts = DecodeOptions(beam=dcfg["beam"], max_active=dcfg["max_active"], lattice_beam=dcfg["lattice_beam"],
                         acoustic_scale=dcfg["acoustic_scale"])
    shards = split_shards(data_dir, feats_dir, lang_dir, test, dcfg["shard_utts"])
    model = GmmModel.load(model_dir)
    blob = broadcast(client, model.to_bytes())
    graph_path = str(Path(graph_dir).resolve() / "HCLG.fst")
    start = time.perf_counter()
    results = run_sharded(client, decode_shard, shards, blob, graph_path, opts,
                          units=[len(s.utts) for s in shards], desc=f"decode-{test}",
                          retries=config["dask"]["retries"])
    wall = time.perf_counter() - start
    return write_decode(out, test, results, wall, {"acoustic_scale": opts.acoustic_scale, "beam": opts.beam}, log)


def write_decode(out: Path, test: str, results: list[DecodeResult], wall: float, settings: dict[str, Any],
                 log=print) -> dict[str, Any]:
    """Write ``hyp.txt`` (one ``utt words`` line each) and ``manifest.json`` (RTF, failures, settings)."""
    with open(out / "hyp.txt", "w", encoding="utf-8") as hyp:
        for r in results:
            for utt, words in r.hyps.items():
                hyp.write(f"{utt} {' '.join(words)}".rstrip() + "\n")
    info = {"test": test, "utterances": sum(len(r.hyps) for r in results), "frames": sum(r.frames for r in results),
            "failed": sorted(u for r in results for u in r.failed), "rtf": rtf(results),
            "wall_seconds": round(wall, 3), **settings}
    (out / "manifest.json").write_text(json.dumps(info, indent=2) + "\n")
    log(f"decoded {info['utterances']} utterances of {test}: RTF {info['rtf']:.4f} (one core per task)")
    return info


def decode_split_nnet(config: dict[str, Any], system: str, net_dir: str | Path, data_dir: str | Path,
                      feats_dir: str | Path, lang_dir: str | Path, test: str, out_dir: str | Path, client: Any,
                      gmm_dir: str | Path | None = None, graph_dir: str | Path | None = None,
                      tuned: dict[str, float] | None = None, log=print) -> dict[str, Any]:
    """Decode split ``test`` with network ``system``: hybrid through the GMM's HCLG, CTC by prefix beam search.

    ``tuned`` (from the tune stage) replaces the configured acoustic scale and insertion penalty,
    or LM weight and word bonus.
    """
    from dataclasses import replace

    from asrflow.decode import ctc
    from asrflow.nnet import NnetError, hybrid

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    dcfg = config["nnet"]["decode"]
    shards = split_shards(data_dir, feats_dir, lang_dir, test, dcfg["shard_utts"], deltas=0)
    network = str(Path(net_dir).resolve() / "final.pt")
    objective = config["nnet"]["models"][system]["objective"]
    start = time.perf_counter()
    if objective == "hybrid":
        if gmm_dir is None or graph_dir is None:
            raise NnetError(f"hybrid network {system!r} needs --gmm and --graph to decode")
        opts = replace(hybrid.decode_options(dcfg, config["decode"]), **(tuned or {}))
        priors = np.load(Path(net_dir) / "priors.npy")
        blob = broadcast(client, GmmModel.load(gmm_dir).to_bytes())
        graph_path = str(Path(graph_dir).resolve() / "HCLG.fst")
        results = run_sharded(client, hybrid.decode_shard, shards, network, priors, blob, graph_path, opts,
                              units=[len(s.utts) for s in shards], desc=f"decode-{system}-{test}",
                              retries=config["dask"]["retries"])
        settings = {"acoustic_scale": opts.acoustic_scale, "insertion_penalty": opts.insertion_penalty,
                    "beam": opts.beam, "max_active": opts.max_active}
    else:
        search = replace(ctc.SearchOptions(beam=dcfg["beam"], lm_weight=dcfg["lm_weight"],
                                           word_bonus=dcfg["word_bonus"], prune=dcfg["prune"]), **(tuned or {}))
        lm = str(Path(lang_dir).resolve() / "lm.arpa") if search.lm_weight > 0 else None
        results = run_sharded(client, ctc.decode_shard, shards, network, lm, search,
                              units=[len(s.utts) for s in shards], desc=f"decode-{system}-{test}",
                              retries=config["dask"]["retries"])
        settings = {"beam": search.beam, "lm_weight": search.lm_weight, "word_bonus": search.word_bonus}
    settings["tuned"] = bool(tuned)
    return write_decode(out, test, results, time.perf_counter() - start, {"system": system, **settings}, log)
