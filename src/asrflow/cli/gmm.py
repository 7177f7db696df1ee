"""``asrflow gmm|align|chain|fmllr``: GMM-HMM training, forced alignment, the chain tree and speaker adaptation on
Dask."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from asrflow.cli.common import _load, _log, stage_cluster, with_config
from asrflow.config import GMM_SYSTEMS


def cmd_gmm(args: argparse.Namespace) -> int:
    """Train a GMM-HMM system on Dask, logged as a ``gmm-<system>-<train>`` stage run."""
    from asrflow.gmm.stage import train_system
    from asrflow.tracking import stage_run

    config = _load(args)
    with stage_run(config, f"gmm-{args.system}-{args.train}", resolved_config=args.config[-1]) as run:
        with stage_cluster(config, args.workers, run) as client:
            manifest = train_system(config, args.system, args.train, args.data, args.features, args.lang,
                                    args.out, client, run, source_dir=args.source, state_dir=args.state,
                                    log=_log)
        run.set_tags({"asrflow.system": args.system, "asrflow.train_set": args.train})
        run.log_metrics({k: manifest[k] for k in ("pdfs", "gaussians", "parameters", "failed", "seconds")})
        for name in ("manifest.json", "report.tsv", "alignment.png"):
            run.log_artifact(Path(args.out) / name)
    return 0


def cmd_align(args: argparse.Namespace) -> int:
    """Force-align a split with a trained GMM system on Dask, logged as an ``align`` stage run."""
    from asrflow.gmm.stage import align_split
    from asrflow.tracking import stage_run

    config = _load(args)
    with stage_run(config, f"align-{args.system}-{args.split}", resolved_config=args.config[-1]) as run:
        with stage_cluster(config, args.workers, run) as client:
            manifest = align_split(config, args.system, args.gmm, args.split, args.data, args.features, args.lang,
                                   args.out, client, log=_log)
        run.set_tags({"asrflow.system": args.system, "asrflow.train_set": args.split})
        run.log_metrics({k: manifest[k] for k in ("aligned", "failed", "retried", "seconds", "loglike_per_frame")})
        for name in ("manifest.json", "report.tsv"):
            run.log_artifact(Path(args.out) / name)
    return 0


def cmd_chain(args: argparse.Namespace) -> int:
    """Build the chain tree and convert a GMM's alignments to it on Dask, logged as a ``chain`` stage run."""
    from asrflow.gmm.stage import build_chain
    from asrflow.tracking import stage_run

    config = _load(args)
    with stage_run(config, f"chain-{args.split}", resolved_config=args.config[-1]) as run:
        with stage_cluster(config, args.workers, run) as client:
            manifest = build_chain(config, args.source, args.alignments, args.split, args.data, args.features,
                                   args.lang, args.out, client, log=_log)
        run.set_tags({"asrflow.system": "chain", "asrflow.train_set": args.split})
        run.log_metrics({k: manifest[k] for k in ("pdfs", "converted", "failed", "seconds")})
        for name in ("manifest.json", "report.tsv"):
            run.log_artifact(Path(args.out) / name)
    return 0


def cmd_fmllr(args: argparse.Namespace) -> int:
    """Speaker-adapted (fMLLR) features of a training split and its test splits, on Dask."""
    from asrflow.config.paths import Paths
    from asrflow.gmm.adapt import adapt_splits
    from asrflow.tracking import stage_run

    config = _load(args)
    with stage_run(config, f"fmllr-{args.system}-{args.train}", resolved_config=args.config[-1]) as run:
        with stage_cluster(config, args.workers, run) as client:
            manifest = adapt_splits(config, args.system, args.train, Paths.of(args), client, log=_log)
        run.set_tags({"asrflow.system": args.system, "asrflow.train_set": args.train})
        for split, info in manifest["splits"].items():
            run.log_metrics({f"{split}.{k}": info[k] for k in ("adapted", "identity", "without_statistics")})
            for p, gain in enumerate(info["gain_per_frame_by_pass"]):
                run.log_metrics({f"{split}.gain_per_frame": gain}, step=p + 1)
        run.log_metrics({"seconds": manifest["seconds"]})
        for name in ("manifest.json", "report.tsv"):
            run.log_artifact(Path(args.out) / name)
    return 0


def register(sub: Any) -> None:
    """Add ``gmm``, ``align``, ``chain`` and ``fmllr`` to the ``sub`` subparsers."""
    p = with_config(sub.add_parser("gmm", help="train a GMM-HMM system (mono, tri, lda or sat) on Dask"))
    p.add_argument("--system", required=True, choices=list(GMM_SYSTEMS))
    p.add_argument("--train", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--features", required=True,
                   help="MFCC features folder (sat: the fmllr stage's folder of the lda system)")
    p.add_argument("--lang", required=True)
    p.add_argument("--source",
                   help="the folder of the system whose alignments start this one (tri: mono; lda: tri; sat: lda)")
    p.add_argument("--out", required=True)
    p.add_argument("--state", help="folder for the progress saved after every iteration, resumed from when the "
                                   "job is rerun after a failure, and where the workers write the alignments while "
                                   "it trains: on a file system they share (default: <out>/.state)")
    p.add_argument("--workers", type=int, default=None)
    p.set_defaults(func=cmd_gmm)

    p = with_config(sub.add_parser("align", help="force-align a split with a trained GMM system on Dask"))
    p.add_argument("--system", required=True, choices=list(GMM_SYSTEMS))
    p.add_argument("--gmm", required=True, help="the GMM system's folder")
    p.add_argument("--split", required=True, help="the split to align (e.g. train_sp: speed-perturbed copies)")
    for name in ("data", "features", "lang", "out"):
        p.add_argument(f"--{name}", required=True)
    p.add_argument("--workers", type=int, default=None)
    p.set_defaults(func=cmd_align)

    p = with_config(sub.add_parser("chain", help="build the chain tree (nnet.chain) from a GMM's alignments and "
                                                 "convert them to it, on Dask"))
    p.add_argument("--source", required=True, help="the folder of the GMM system nnet.chain.source")
    p.add_argument("--alignments", required=True, help="its alignments of --split: that folder, or the align "
                                                       "stage's folder of the speed-perturbed copies")
    p.add_argument("--split", required=True, help="the split aligned (train, or train_sp)")
    for name in ("data", "lang", "out"):
        p.add_argument(f"--{name}", required=True)
    p.add_argument("--features", required=True, help="the features the source GMM reads (sat: the fmllr stage's "
                                                     "folder of the lda system)")
    p.add_argument("--workers", type=int, default=None)
    p.set_defaults(func=cmd_chain)

    p = with_config(sub.add_parser("fmllr", help="speaker-adapted (fMLLR) features of a training split and its "
                                                 "test splits with a trained GMM system, on Dask"))
    p.add_argument("--system", required=True, choices=list(GMM_SYSTEMS))
    p.add_argument("--train", required=True)
    p.add_argument("--gmm", required=True, help="the GMM system's folder")
    p.add_argument("--graph", required=True, help="its HCLG folder (first decoding pass of the test speakers)")
    p.add_argument("--alignments", help="align folder of the speed-perturbed copies (adapted too when given)")
    p.add_argument("--init", help="fmllr folder whose transforms each speaker starts from (sat: the lda's)")
    for name in ("data", "features", "lang", "out"):
        p.add_argument(f"--{name}", required=True)
    p.add_argument("--workers", type=int, default=None)
    p.set_defaults(func=cmd_fmllr)
