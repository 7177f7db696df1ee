"""``asrflow config|data|features|lang``: the config, the corpus, its features and the lang stage."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from asrflow.cli.common import _load, _log, stage_cluster, with_config
from asrflow.config import write_resolved


def cmd_config(args: argparse.Namespace) -> int:
    """Validate the config; print it resolved, or write it to ``--out``."""
    config = _load(args)
    if args.out:
        write_resolved(config, args.out)
        _log(f"resolved config written to {args.out}")
    else:
        print(json.dumps(config, indent=2))
    return 0


def _by_reason(counts: dict[str, int]) -> dict[str, int]:
    """MLflow metrics ``rejected.<reason>`` of rejection counts by kind of reason."""
    return {f"rejected.{reason.replace(' ', '_')}": n for reason, n in counts.items()}


def cmd_data(args: argparse.Namespace) -> int:
    """Import the corpus into validated Kaldi data dirs on Dask, logged as the ``data`` stage run."""
    from asrflow.corpus import CorpusError
    from asrflow.data.stage import prepare_data, reason_counts
    from asrflow.tracking import stage_run

    config = _load(args)
    with stage_run(config, "data", resolved_config=args.config[-1]) as run:
        try:
            with stage_cluster(config, args.workers, run) as client:
                summary = prepare_data(config, args.out, client, log=_log, kept_report=args.report)
        except CorpusError:
            if args.report and Path(args.report).is_file():  # what was rejected is counted even when all was
                counts = reason_counts(Path(args.report))
                run.log_metrics({"rejected": sum(counts.values()), **_by_reason(counts)})
                run.log_artifact(args.report)
            raise
        out = Path(args.out)
        run.log_metrics({
            "utterances": summary.utterances, "hours": summary.hours, "rejected": summary.rejected,
            "wall_seconds": summary.wall_seconds, "x_real_time": summary.x_real_time,
            **{f"split.{k}.utterances": v["utterances"] for k, v in summary.splits.items()},
            **_by_reason(summary.rejected_by_reason),
            **{f"extra_training.{tag}.{k}": v for tag, stats in summary.extra_training.items()
               for k, v in stats.items()},
        })
        run.set_tags({"asrflow.corpus": summary.corpus, "asrflow.corpus_fingerprint": summary.fingerprint})
        run.log_artifact(out / "report.tsv")
        run.log_artifact(out / "manifest.json")
    return 0


def cmd_features(args: argparse.Namespace) -> int:
    """Extract one feature kind on Dask, logged as a ``features-<kind>`` stage run."""
    from asrflow.features.stage import extract_features
    from asrflow.tracking import stage_run

    config = _load(args)
    workers = config["dask"]["workers"] or args.workers or 1
    with stage_run(config, f"features-{args.kind}", resolved_config=args.config[-1]) as run:
        with stage_cluster(config, workers, run) as client:
            workers = len(client.scheduler_info()["workers"]) or workers  # Slurm worker jobs may differ
            summary = extract_features(config, args.data, args.kind, args.out, client, workers, log=_log)
        data_manifest = json.loads((Path(args.data) / "manifest.json").read_text(encoding="utf-8"))
        run.set_tags({"asrflow.corpus_fingerprint": data_manifest["fingerprint"]})
        run.log_metrics({
            "utterances": summary.utterances, "hours": summary.audio_hours, "frames": summary.frames,
            "rejected": summary.failed, "wall_seconds": summary.wall_seconds,
            "x_real_time": summary.x_real_time, "workers": summary.workers, "dim": summary.dim,
        })
        out = Path(args.out)
        run.log_artifact(out / "manifest.json")
        run.log_artifact(out / "report.tsv")
        for split in data_manifest["splits"]:
            run.log_artifact(out / split / "cmvn.ark", f"cmvn/{split}")
    return 0


def cmd_lang(args: argparse.Namespace) -> int:
    """Build the lexicon, LM, L and G of a training split, logged as a ``lang-<train>`` stage run."""
    from asrflow.lang.stage import prepare_lang
    from asrflow.tracking import stage_run

    config = _load(args)
    if args.heldout_of:
        return _heldout_lang(config, args)
    with stage_run(config, f"lang-{args.train}", resolved_config=args.config[-1]) as run:
        report = prepare_lang(config, args.data, args.train, args.tests, args.out, log=_log)
        run.log_metrics({"words": report["words"], "phones": report["phones"],
                         "grapheme_fallback_words": report["grapheme_fallback_words"],
                         "cmudict_fallback_words": report["cmudict_fallback_words"],
                         "train_perplexity": report["train_perplexity"],
                         **{f"{t}.oov_rate": v["oov_rate"] for t, v in report["test_sets"].items()},
                         **{f"{t}.perplexity": v["perplexity"] for t, v in report["test_sets"].items()}})
        for name in ("manifest.json", "lexicon.txt", "lm.arpa"):
            run.log_artifact(Path(args.out) / name)
    return 0


def _heldout_lang(config: dict[str, Any], args: argparse.Namespace) -> int:
    """Write the lang decoder tuning decodes the held-out utterances with: ``--heldout-of`` (the split's lang)
    with an LM estimated without their transcripts; logged as a ``lang-<train>-heldout`` stage run."""
    from asrflow.decode.tune import heldout_lang
    from asrflow.tracking import stage_run

    with stage_run(config, f"lang-{args.train}-heldout", resolved_config=args.config[-1]) as run:
        _, vocabulary = heldout_lang(config, args.heldout_of, args.data, args.train, args.out)
        _log(f"held-out lang of {args.train}: an LM of {len(vocabulary)} words without the held-out transcripts")
        run.log_metrics({"words": len(vocabulary)})
    return 0


def register(sub: Any) -> None:
    """Add ``config``, ``data``, ``features`` and ``lang`` to the ``sub`` subparsers."""
    p = with_config(sub.add_parser("config", help="validate a config and print or write it resolved"))
    p.add_argument("--out", help="write the resolved config here instead of printing it")
    p.set_defaults(func=cmd_config)

    p = with_config(sub.add_parser("data", help="import a corpus into validated Kaldi data dirs"))
    p.add_argument("--out", required=True, help="output folder (results/<exp>/data)")
    p.add_argument("--report", help="also write the rejection report here, outside --out: a failed job's "
                                    "outputs are removed, this copy stays (results/<exp>/logs/data.report.tsv)")
    p.add_argument("--workers", type=int, default=None, help="Dask workers when dask.workers is null")
    p.set_defaults(func=cmd_data)

    p = with_config(sub.add_parser("features", help="extract one feature kind on Dask"))
    p.add_argument("--data", required=True, help="data stage folder (results/<exp>/data)")
    p.add_argument("--kind", required=True, choices=["mfcc", "fbank"])
    p.add_argument("--out", required=True, help="output folder (results/<exp>/features/<kind>)")
    p.add_argument("--workers", type=int, default=None, help="Dask workers when dask.workers is null")
    p.set_defaults(func=cmd_features)

    p = with_config(sub.add_parser("lang", help="lexicon, LM, L and G for a training split"))
    p.add_argument("--data", required=True)
    p.add_argument("--train", required=True, help="training split (its transcripts make the LM)")
    p.add_argument("--tests", nargs="*", default=[], help="test splits to report OOV rates for")
    p.add_argument("--heldout-of", help="instead, write the lang decoder tuning uses: this lang folder (the "
                                        "split's) with an LM estimated without the held-out utterances' transcripts")
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_lang)
