"""``asrflow nnet|ensemble``: network training and ensembles, with their MLflow pyfunc models."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from asrflow.cli.common import _load, _log, with_config


def cmd_nnet(args: argparse.Namespace) -> int:
    """Train a network (one learner of torchrun); only rank 0 logs the ``nnet-<system>-<train>`` run."""
    import os

    import torch

    from asrflow.config import settings
    from asrflow.config.paths import Paths
    from asrflow.nnet.stage import train_system
    from asrflow.nnet.transcribe import bundle_files
    from asrflow.tracking import StageRun, stage_run

    config = _load(args)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if args.threads:
        torch.set_num_threads(max(1, args.threads // world))
    rank = int(os.environ.get("RANK", "0"))
    paths = Paths.of(args)
    if rank != 0:  # only rank 0 talks to MLflow
        train_system(config, args.system, args.train, paths, StageRun(), log=lambda m: None)
        return 0
    with stage_run(config, f"nnet-{args.system}-{args.train}", resolved_config=args.config[-1]) as run:
        parallel = settings.parallel(config, args.system)
        run.set_tags({"asrflow.system": args.system, "asrflow.train_set": args.train,
                      "asrflow.strategy": parallel.strategy if world > 1 else "single"})
        run.log_params({f"nnet.parallel.effective.{k}": v for k, v in parallel.as_dict().items()})
        manifest = train_system(config, args.system, args.train, paths, run, log=_log)
        means = ("mean_t_data", "mean_t_calc", "mean_t_transmit", "mean_t_merge", "mean_t_wait", "mean_bytes_per_step")
        run.log_metrics({**{k: manifest[k] for k in ("parameters", "epochs", "steps", "best_valid_loss",
                                                      "final_valid_loss", "seconds", "rejected", *means)},
                         **({"best_valid_frame_accuracy": manifest["best_valid_frame_accuracy"]}
                            if manifest.get("best_valid_frame_accuracy") is not None else {}),
                         # whole-run means; frames_per_second / data_wait_fraction are the per-step series
                         "mean_frames_per_second": manifest["frames_per_second"],
                         "mean_data_wait_fraction": manifest["data_wait_fraction"],
                         "model_bytes": (Path(args.out) / "final.pt").stat().st_size})
        out = Path(args.out)
        run.log_artifact(out / "manifest.json")
        run.log_artifact(out / "report.tsv")
        run.log_artifact(out / "final.pt")
        if not config["nnet"]["decode"]["tune"]["enabled"]:  # else the tune stage logs it, with its settings
            _log_model(run, bundle_files(config, args.system, args.train, paths.replace(model=out)))
    return 0


def cmd_ensemble(args: argparse.Namespace) -> int:
    """Combine trained hybrid networks into an ensemble network, logged as an nnet stage run."""
    from asrflow.config.paths import Paths
    from asrflow.nnet.ensemble import assemble
    from asrflow.nnet.transcribe import bundle_files
    from asrflow.tracking import stage_run

    config = _load(args)
    with stage_run(config, f"nnet-{args.system}-{args.train}", resolved_config=args.config[-1]) as run:
        run.set_tags({"asrflow.system": args.system, "asrflow.train_set": args.train, "asrflow.strategy": "ensemble"})
        manifest = assemble(config, args.system, args.members, args.out, log=_log)  # members: the config params
        out = Path(args.out)
        run.log_metrics({"parameters": manifest["parameters"], "seconds": manifest["seconds"],
                         "model_bytes": (out / "final.pt").stat().st_size})
        for name in ("manifest.json", "report.tsv", "final.pt"):
            run.log_artifact(out / name)
        if not config["nnet"]["decode"]["tune"]["enabled"]:  # else the tune stage logs it, with its settings
            _log_model(run, bundle_files(config, args.system, args.train, Paths.of(args).replace(model=out)))
    return 0


def _log_model(run: Any, files: dict[str, str]) -> None:
    """Log the pyfunc transcriber of ``files`` (:func:`asrflow.nnet.transcribe.bundle_files`) into ``run``."""
    if not files:
        _log("no MLflow pyfunc model: the network reads speaker-adapted (fmllr) features, which need a GMM "
             "first pass over each speaker's utterances")
        return
    uri = run.log_model(files)
    if uri:
        _log(f"MLflow pyfunc model: {uri}")
    elif run.recorder is not None:
        _log("MLflow pyfunc model: logged into this stage's run by the workflow's tracking relay")


def register(sub: Any) -> None:
    """Add ``nnet`` and ``ensemble`` to the ``sub`` subparsers."""
    p = with_config(sub.add_parser("nnet", help="train a network of nnet.models (run it under torchrun)"))
    p.add_argument("--system", required=True, help="a name in nnet.models")
    for name in ("train", "data", "features", "out"):
        p.add_argument(f"--{name}", required=True)
    p.add_argument("--gmm", help="GMM system folder with the alignments (hybrid)")
    p.add_argument("--alignments", help="align stage folder: that GMM's alignments of <train>_sp (speed_perturb)")
    p.add_argument("--graph", help="its HCLG folder (bundled into the MLflow model of a hybrid network; "
                   "the MMI denominator)")
    p.add_argument("--lang", help="lang folder (its LM is bundled into the MLflow model of a CTC network)")
    p.add_argument("--init", help="the trained network folder the weights start from (the model's init)")
    p.add_argument("--teacher", help="the trained network folder of the model's teacher (teacher–student training)")
    p.add_argument("--state", help="folder for the resumable training state (default: <out>/state)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads, shared by the local processes")
    p.set_defaults(func=cmd_nnet)

    p = with_config(sub.add_parser("ensemble", help="combine trained hybrid networks into an ensemble network"))
    p.add_argument("--system", required=True, help="an ensemble in nnet.models")
    p.add_argument("--members", nargs="+", required=True, help="the members' network folders, in config order")
    for name in ("train", "features", "gmm", "graph", "lang", "out"):
        p.add_argument(f"--{name}", required=True)
    p.set_defaults(func=cmd_ensemble)
