"""``asrflow graph|decode|tune|score``: decoding graphs, decoding, decoder tuning and scoring."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from asrflow.cli.common import _load, _log, stage_cluster, with_config
from asrflow.cli.nnet import _log_model
from asrflow.config import GMM_SYSTEMS


def cmd_graph(args: argparse.Namespace) -> int:
    """Build HCLG for a GMM system (``--model``) or TLG for phone CTC networks (``--ctc``)."""
    from asrflow.decode.stage import make_graph

    if bool(args.ctc) == bool(args.model):
        raise SystemExit("asrflow graph: give either --model (HCLG for a GMM) or --ctc (TLG for phone CTC networks)")
    make_graph(args.lang, None if args.ctc else args.model, args.out, log=_log)
    return 0


def _gmm_adapted(system: str) -> bool | None:
    """Whether a GMM system reads fMLLR-adapted features (``<gmm>_fmllr``); None for a network."""
    from asrflow.config import FMLLR_SYSTEMS

    if system in GMM_SYSTEMS:
        return False
    return True if system in FMLLR_SYSTEMS else None


def cmd_decode(args: argparse.Namespace) -> int:
    """Decode a test split with a GMM system or a network on Dask, logged as a ``decode`` stage run."""
    from asrflow.config.paths import Paths
    from asrflow.decode.stage import decode_split, decode_split_nnet
    from asrflow.decode.tune import tuned_settings
    from asrflow.tracking import stage_run

    config = _load(args)
    with stage_run(config, f"decode-{args.system}-{args.test}", resolved_config=args.config[-1]) as run:
        run.set_tags({"asrflow.system": args.system, "asrflow.test_set": args.test})
        with stage_cluster(config, args.workers, run) as client:
            tuned = tuned_settings(args.tune)
            run.log_params({f"tuned.{k}": v for k, v in tuned.items()})
            if (adapted := _gmm_adapted(args.system)) is not None:
                info = decode_split(config, args.model, args.graph, args.data, args.features, args.lang, args.test,
                                    args.out, client, adapted=adapted, tuned=tuned, log=_log)
            else:
                info = decode_split_nnet(config, args.system, args.test, Paths.of(args), client, tuned=tuned,
                                         log=_log)
        run.log_metrics({"rtf": info["rtf"], "utterances": info["utterances"], "failed": len(info["failed"]),
                         "partial": len(info["partial"])})
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    """Choose a system's decoder settings on held-out utterances; log a network's pyfunc model with them."""
    from asrflow.config.paths import Paths
    from asrflow.decode.tune import tune_gmm, tune_network
    from asrflow.nnet.transcribe import bundle_files
    from asrflow.tracking import stage_run

    config = _load(args)
    adapted = _gmm_adapted(args.system)
    if args.heldout_graph and not args.heldout_lang:
        raise SystemExit("asrflow tune: --heldout-graph needs --heldout-lang, the lang it was built from")
    with stage_run(config, f"tune-{args.system}-{args.train}", resolved_config=args.config[-1]) as run:
        run.set_tags({"asrflow.system": args.system})
        with stage_cluster(config, args.workers, run) as client:
            if adapted is not None:
                heldout = (Path(args.heldout_lang), Path(args.heldout_graph)) if args.heldout_graph else None
                info = tune_gmm(config, args.system, args.model, args.data, args.features, args.lang, args.train,
                                args.out, client, adapted=adapted, heldout=heldout, log=_log)
            else:
                info = tune_network(config, args.system, args.train, Paths.of(args), client, log=_log)
        run.log_params({f"tuned.{k}": v for k, v in info["chosen"].items()})
        run.log_metrics({"held_out_errors": info["errors"], "held_out_wer": info["wer"],
                         "held_out_words": info["words"], "grid_points": len(info["grid"]),
                         "tuned_at_edge": len(info["at_edge"])})
        run.log_artifact(args.out)
        if adapted is not None:  # a GMM: no MLflow model
            return 0
        # the pyfunc model, decoding with the tuned settings (as the test sets are decoded)
        _log_model(run, bundle_files(config, args.system, args.train, Paths.of(args), tuned=info["chosen"]))
    return 0


def cmd_score(args: argparse.Namespace) -> int:
    """Score a decoded test split, logged as a ``score`` stage run."""
    from asrflow.lang.stage import lm_has_transcripts
    from asrflow.score.stage import score_split
    from asrflow.tracking import stage_run

    config = _load(args)
    with stage_run(config, f"score-{args.system}-{args.test}", resolved_config=args.config[-1]) as run:
        summary = score_split(args.data, args.test, args.decode, args.lang, args.out, log=_log,
                              groups=config["evaluation"]["groups"], sentences=lm_has_transcripts(config["lang"]))
        run.set_tags({"asrflow.system": args.system, "asrflow.test_set": args.test})
        run.log_metrics({k: summary[k] for k in ("wer", "ser", "sub", "del", "ins", "n_ref_words", "n_utts",
                                                   "oov_rate", "rtf", "wer_in_vocabulary")
                         if summary.get(k) is not None})
        run.log_metrics({f"wer.{attribute}.{group}": s["wer"]
                         for attribute, by_group in summary.get("groups", {}).items() for group, s in by_group.items()})
        run.log_metrics({f"wer.sentences.{group}": s["wer"] for group, s in summary.get("sentences", {}).items()})
        run.log_artifact(args.out)
    return 0


def register_graph(sub: Any) -> None:
    """Add ``graph`` to the ``sub`` subparsers (separately: ``asrflow --help`` lists it before ``nnet``)."""
    p = sub.add_parser("graph", help="build HCLG for a trained GMM system, or TLG for phone CTC networks")
    p.add_argument("--lang", required=True)
    p.add_argument("--model", help="GMM system folder: build its HCLG")
    p.add_argument("--ctc", action="store_true", help="build TLG for CTC networks over the lang's phones")
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_graph)


def register(sub: Any) -> None:
    """Add ``decode``, ``tune`` and ``score`` to the ``sub`` subparsers (``graph``: :func:`register_graph`)."""
    p = with_config(sub.add_parser("decode", help="decode a test split (GMM or network) on Dask"))
    for name in ("system", "test", "model", "data", "features", "lang", "out"):
        p.add_argument(f"--{name}", required=True)
    p.add_argument("--graph", help="HCLG folder (GMM and hybrid systems)")
    p.add_argument("--gmm", help="GMM system folder (hybrid networks: transition model)")
    p.add_argument("--tune", help="tune stage folder of the system (its tune.json replaces the configured settings)")
    p.add_argument("--workers", type=int, default=None)
    p.set_defaults(func=cmd_decode)

    p = with_config(sub.add_parser("tune", help="choose a network's or GMM's decoder settings on held-out utterances"))
    for name in ("system", "train", "model", "data", "features", "lang", "out"):
        p.add_argument(f"--{name}", required=True)
    p.add_argument("--graph", help="HCLG folder (hybrid networks)")
    p.add_argument("--gmm", help="GMM system folder (hybrid networks: transition model)")
    p.add_argument("--heldout-lang", help="the lang whose LM has not seen the held-out utterances (asrflow lang "
                                          "--heldout-of); absent: made in --out")
    p.add_argument("--heldout-graph",
                   help="its graph (asrflow graph): the HCLG of this system's tree, or TLG; absent: built in --out")
    p.add_argument("--workers", type=int, default=None)
    p.set_defaults(func=cmd_tune)

    p = with_config(sub.add_parser("score", help="score a decoded test split"))
    for name in ("system", "test", "data", "decode", "lang", "out"):
        p.add_argument(f"--{name}", required=True)
    p.set_defaults(func=cmd_score)
