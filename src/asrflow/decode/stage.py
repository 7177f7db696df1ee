"""The graph and decode stages: HCLG for a trained system, then 1-best decoding of a test split."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from asrflow.cluster import broadcast, run_sharded
from asrflow.decode.decoder import DecodeOptions, decode_shard, rtf, words_of
from asrflow.gmm.model import GmmModel
from asrflow.gmm.shards import split_shards
from asrflow.kaldi import kfst
from asrflow.lang.graph import make_hclg, read_symbols


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
    words = read_symbols(Path(graph_dir) / "words.txt")
    id2word = [""] * (max(words.values()) + 1)
    for w, i in words.items():
        id2word[i] = w
    with open(out / "hyp.txt", "w", encoding="utf-8") as hyp:
        for r in results:
            for utt, ids in r.hyps.items():
                hyp.write(f"{utt} {words_of(ids, id2word)}\n".rstrip(" \n") + "\n")
    frames = sum(r.frames for r in results)
    info = {"test": test, "utterances": sum(len(r.hyps) for r in results), "frames": frames,
            "failed": sorted(u for r in results for u in r.failed), "rtf": rtf(results),
            "wall_seconds": round(wall, 3), "acoustic_scale": opts.acoustic_scale, "beam": opts.beam}
    (out / "manifest.json").write_text(json.dumps(info, indent=2) + "\n")
    log(f"decoded {info['utterances']} utterances of {test}: RTF {info['rtf']:.4f} (one core per task)")
    return info
