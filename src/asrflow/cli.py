"""The ``asrflow`` command line: a thin layer over the library, one sub-command per stage.

Snakemake rules call these; each prints a clear ``asrflow: error: ...`` line (and exits
non-zero) for the faults a user can make, instead of a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from asrflow.config import GMM_SYSTEMS, ConfigError, load_config, write_resolved

EXIT_USAGE = 2


def _log(message: str) -> None:
    print(message, flush=True)


def _load(args: argparse.Namespace) -> dict[str, Any]:
    return load_config(*args.config)


def cmd_config(args: argparse.Namespace) -> int:
    config = _load(args)
    if args.out:
        write_resolved(config, args.out)
        _log(f"resolved config written to {args.out}")
    else:
        print(json.dumps(config, indent=2))
    return 0


def cmd_data(args: argparse.Namespace) -> int:
    from asrflow.cluster import dask_client
    from asrflow.data.stage import prepare_data
    from asrflow.tracking import stage_run

    config = _load(args)
    with stage_run(config, "data", resolved_config=args.config[-1]) as run:
        with dask_client(config["dask"], args.workers, log=_log) as client:
            summary = prepare_data(config, args.out, client, log=_log)
        out = Path(args.out)
        run.log_metrics({
            "utterances": summary.utterances, "hours": summary.hours, "rejected": summary.rejected,
            "wall_seconds": summary.wall_seconds, "x_real_time": summary.x_real_time,
            **{f"split.{k}.utterances": v["utterances"] for k, v in summary.splits.items()},
            **{f"rejected.{k.replace(' ', '_')}": v for k, v in summary.rejected_by_reason.items()},
            **{f"extra_training.{tag}.{k}": v for tag, stats in summary.extra_training.items()
               for k, v in stats.items()},
        })
        run.set_tags({"asrflow.corpus": summary.corpus, "asrflow.corpus_fingerprint": summary.fingerprint})
        run.log_artifact(out / "report.tsv")
        run.log_artifact(out / "manifest.json")
    return 0


def cmd_features(args: argparse.Namespace) -> int:
    from asrflow.cluster import dask_client
    from asrflow.features.stage import extract_features
    from asrflow.tracking import stage_run

    config = _load(args)
    workers = config["dask"]["workers"] or args.workers or 1
    with stage_run(config, f"features-{args.kind}", resolved_config=args.config[-1]) as run:
        with dask_client(config["dask"], workers, log=_log) as client:
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
    from asrflow.lang.stage import prepare_lang
    from asrflow.tracking import stage_run

    config = _load(args)
    with stage_run(config, f"lang-{args.train}", resolved_config=args.config[-1]) as run:
        report = prepare_lang(config, args.data, args.train, args.tests, args.out, log=_log)
        run.log_metrics({"words": report["words"], "phones": report["phones"],
                         "grapheme_fallback_words": report["grapheme_fallback_words"],
                         "train_perplexity": report["train_perplexity"],
                         **{f"{t}.oov_rate": v["oov_rate"] for t, v in report["test_sets"].items()},
                         **{f"{t}.perplexity": v["perplexity"] for t, v in report["test_sets"].items()}})
        for name in ("manifest.json", "lexicon.txt", "lm.arpa"):
            run.log_artifact(Path(args.out) / name)
    return 0


def cmd_gmm(args: argparse.Namespace) -> int:
    from asrflow.cluster import dask_client
    from asrflow.gmm.stage import train_system
    from asrflow.tracking import stage_run

    config = _load(args)
    with stage_run(config, f"gmm-{args.system}-{args.train}", resolved_config=args.config[-1]) as run:
        with dask_client(config["dask"], args.workers, log=_log) as client:
            manifest = train_system(config, args.system, args.train, args.data, args.features, args.lang,
                                    args.out, client, run, source_dir=args.source, log=_log)
        run.set_tags({"asrflow.system": args.system, "asrflow.train_set": args.train})
        run.log_metrics({k: manifest[k] for k in ("pdfs", "gaussians", "parameters", "failed", "seconds")})
        for name in ("manifest.json", "report.tsv", "alignment.png"):
            run.log_artifact(Path(args.out) / name)
    return 0


def cmd_align(args: argparse.Namespace) -> int:
    from asrflow.cluster import dask_client
    from asrflow.gmm.stage import align_split
    from asrflow.tracking import stage_run

    config = _load(args)
    with stage_run(config, f"align-{args.system}-{args.split}", resolved_config=args.config[-1]) as run:
        with dask_client(config["dask"], args.workers, log=_log) as client:
            manifest = align_split(config, args.system, args.gmm, args.split, args.data, args.features, args.lang,
                                   args.out, client, log=_log)
        run.set_tags({"asrflow.system": args.system, "asrflow.train_set": args.split})
        run.log_metrics({k: manifest[k] for k in ("aligned", "failed", "retried", "seconds", "loglike_per_frame")})
        for name in ("manifest.json", "report.tsv"):
            run.log_artifact(Path(args.out) / name)
    return 0


def cmd_fmllr(args: argparse.Namespace) -> int:
    from asrflow.cluster import dask_client
    from asrflow.gmm.adapt import adapt_splits
    from asrflow.tracking import stage_run

    config = _load(args)
    with stage_run(config, f"fmllr-{args.system}-{args.train}", resolved_config=args.config[-1]) as run:
        with dask_client(config["dask"], args.workers, log=_log) as client:
            manifest = adapt_splits(config, args.system, args.train, args.gmm, args.graph, args.data, args.features,
                                    args.lang, args.out, client, align_dir=args.alignments, init_dir=args.init,
                                    log=_log)
        run.set_tags({"asrflow.system": args.system, "asrflow.train_set": args.train})
        for split, info in manifest["splits"].items():
            run.log_metrics({f"{split}.{k}": info[k] for k in ("adapted", "identity", "without_statistics")})
            for p, gain in enumerate(info["gain_per_frame_by_pass"]):
                run.log_metrics({f"{split}.gain_per_frame": gain}, step=p + 1)
        run.log_metrics({"seconds": manifest["seconds"]})
        for name in ("manifest.json", "report.tsv"):
            run.log_artifact(Path(args.out) / name)
    return 0


def cmd_nnet(args: argparse.Namespace) -> int:
    import os

    import torch

    from asrflow.nnet.stage import train_system
    from asrflow.nnet.transcribe import bundle_files
    from asrflow.tracking import StageRun, stage_run
    from asrflow.workflow import parallel_settings

    config = _load(args)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if args.threads:
        torch.set_num_threads(max(1, args.threads // world))
    rank = int(os.environ.get("RANK", "0"))
    gmm = Path(args.gmm) if args.gmm else None
    graph = Path(args.graph) if args.graph else None
    if rank != 0:  # only rank 0 talks to MLflow
        train_system(config, args.system, args.train, args.data, args.features, gmm, args.out, StageRun(),
                     state_dir=args.state, lang_dir=args.lang, alignments=args.alignments, graph_dir=graph,
                     init_dir=args.init, log=lambda m: None)
        return 0
    with stage_run(config, f"nnet-{args.system}-{args.train}", resolved_config=args.config[-1]) as run:
        parallel = parallel_settings(config, args.system)
        run.set_tags({"asrflow.system": args.system, "asrflow.train_set": args.train,
                      "asrflow.strategy": parallel["strategy"] if world > 1 else "single"})
        run.log_params({f"nnet.parallel.effective.{k}": v for k, v in parallel.items()})
        manifest = train_system(config, args.system, args.train, args.data, args.features, gmm, args.out, run,
                                state_dir=args.state, lang_dir=args.lang, alignments=args.alignments, graph_dir=graph,
                                init_dir=args.init, log=_log)
        means = ("mean_t_data", "mean_t_calc", "mean_t_transmit", "mean_t_merge", "mean_t_wait", "mean_bytes_per_step")
        run.log_metrics({**{k: manifest[k] for k in ("parameters", "epochs", "steps", "best_valid_loss", "seconds",
                                                      "rejected", *means)},
                         **({"best_valid_frame_accuracy": manifest["best_valid_frame_accuracy"]}
                            if manifest.get("best_valid_frame_accuracy") is not None else {}),
                         # whole-run means; frames_per_second / data_wait_fraction are the per-step series
                         "mean_frames_per_second": manifest["frames_per_second"],
                         "mean_data_wait_fraction": manifest["data_wait_fraction"]})
        out = Path(args.out)
        run.log_artifact(out / "manifest.json")
        run.log_artifact(out / "report.tsv")
        run.log_artifact(out / "final.pt")
        if not config["nnet"]["decode"]["tune"]["enabled"]:  # else the tune stage logs it, with its settings
            files = bundle_files(config, args.system, out, Path(args.features), args.train, gmm, graph,
                                 Path(args.lang) if args.lang else None)
            _log_model(run, files)
    return 0


def cmd_ensemble(args: argparse.Namespace) -> int:
    from asrflow.nnet.ensemble import assemble
    from asrflow.nnet.transcribe import bundle_files
    from asrflow.tracking import stage_run

    config = _load(args)
    with stage_run(config, f"nnet-{args.system}-{args.train}", resolved_config=args.config[-1]) as run:
        run.set_tags({"asrflow.system": args.system, "asrflow.train_set": args.train, "asrflow.strategy": "ensemble"})
        manifest = assemble(config, args.system, args.members, args.out, log=_log)  # members: the config params
        run.log_metrics({"parameters": manifest["parameters"], "seconds": manifest["seconds"]})
        out = Path(args.out)
        for name in ("manifest.json", "report.tsv", "final.pt"):
            run.log_artifact(out / name)
        if not config["nnet"]["decode"]["tune"]["enabled"]:  # else the tune stage logs it, with its settings
            _log_model(run, bundle_files(config, args.system, out, Path(args.features), args.train, Path(args.gmm),
                                         Path(args.graph), Path(args.lang)))
    return 0


def _log_model(run: Any, files: dict[str, str]) -> None:
    """Log the pyfunc transcriber of ``files`` (:func:`asrflow.nnet.transcribe.bundle_files`) into ``run``."""
    from asrflow.tracking.pyfunc import log_transcriber

    if not files:
        _log("no MLflow pyfunc model: the network reads speaker-adapted (fmllr) features, which need a GMM "
             "first pass over each speaker's utterances")
        return
    uri = log_transcriber(run, files)
    if uri:
        _log(f"MLflow pyfunc model: {uri}")


def cmd_graph(args: argparse.Namespace) -> int:
    from asrflow.decode.stage import make_graph

    if bool(args.ctc) == bool(args.model):
        raise SystemExit("asrflow graph: give either --model (HCLG for a GMM) or --ctc (TLG for phone CTC networks)")
    make_graph(args.lang, None if args.ctc else args.model, args.out, log=_log)
    return 0


def _gmm_deltas(system: str) -> int | None:
    """Δ orders a GMM system's features get when read (its adapted features come with Δ+ΔΔ); None for a network."""
    from asrflow.config import FMLLR_SYSTEMS

    if system in GMM_SYSTEMS:
        return 2
    return 0 if system in FMLLR_SYSTEMS else None


def cmd_decode(args: argparse.Namespace) -> int:
    from asrflow.cluster import dask_client
    from asrflow.decode.stage import decode_split
    from asrflow.tracking import stage_run

    from asrflow.decode.stage import decode_split_nnet
    from asrflow.decode.tune import tuned_settings

    config = _load(args)
    with stage_run(config, f"decode-{args.system}-{args.test}", resolved_config=args.config[-1]) as run:
        run.set_tags({"asrflow.system": args.system, "asrflow.test_set": args.test})
        with dask_client(config["dask"], args.workers, log=_log) as client:
            tuned = tuned_settings(args.tune)
            run.log_params({f"tuned.{k}": v for k, v in tuned.items()})
            if (deltas := _gmm_deltas(args.system)) is not None:
                info = decode_split(config, args.model, args.graph, args.data, args.features, args.lang, args.test,
                                    args.out, client, deltas=deltas, tuned=tuned, log=_log)
            else:
                info = decode_split_nnet(config, args.system, args.model, args.data, args.features, args.lang,
                                         args.test, args.out, client, gmm_dir=args.gmm, graph_dir=args.graph,
                                         tuned=tuned, log=_log)
        run.log_metrics({"rtf": info["rtf"], "utterances": info["utterances"], "failed": len(info["failed"])})
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    from asrflow.cluster import dask_client
    from asrflow.decode.tune import tune_gmm, tune_network
    from asrflow.nnet.transcribe import bundle_files
    from asrflow.tracking import stage_run

    config = _load(args)
    deltas = _gmm_deltas(args.system)
    with stage_run(config, f"tune-{args.system}-{args.train}", resolved_config=args.config[-1]) as run:
        run.set_tags({"asrflow.system": args.system})
        with dask_client(config["dask"], args.workers, log=_log) as client:
            if deltas is not None:
                info = tune_gmm(config, args.system, args.model, args.data, args.features, args.lang, args.train,
                                args.out, client, deltas=deltas, log=_log)
            else:
                info = tune_network(config, args.system, args.model, args.data, args.features, args.lang,
                                    args.train, args.out, client, gmm_dir=args.gmm, graph_dir=args.graph, log=_log)
        run.log_params({f"tuned.{k}": v for k, v in info["chosen"].items()})
        run.log_metrics({"held_out_errors": info["errors"], "held_out_wer": info["wer"],
                         "held_out_words": info["words"], "grid_points": len(info["grid"])})
        run.log_artifact(args.out)
        if deltas is not None:  # a GMM: no MLflow model
            return 0
        # the pyfunc model, decoding with the tuned settings (as the test sets are decoded)
        _log_model(run, bundle_files(config, args.system, Path(args.model), Path(args.features), args.train,
                                     Path(args.gmm) if args.gmm else None, Path(args.graph) if args.graph else None,
                                     Path(args.lang), out_dir=Path(args.out), tuned=info["chosen"]))
    return 0


def cmd_score(args: argparse.Namespace) -> int:
    from asrflow.score.stage import score_split
    from asrflow.tracking import stage_run

    config = _load(args)
    with stage_run(config, f"score-{args.system}-{args.test}", resolved_config=args.config[-1]) as run:
        summary = score_split(args.data, args.test, args.decode, args.lang, args.out, log=_log)
        run.set_tags({"asrflow.system": args.system, "asrflow.test_set": args.test})
        run.log_metrics({k: summary[k] for k in ("wer", "ser", "sub", "del", "ins", "n_ref_words", "n_utts",
                                                   "oov_rate", "rtf") if summary.get(k) is not None})
        run.log_artifact(args.out)
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from asrflow.report.compare import csv_text, html, markdown, system_rows, table
    from asrflow.tracking import tracking_uri
    from asrflow.tracking.query import latest_by_stage, metric_history, stage_runs

    if args.config:
        config = _load(args)
    else:
        config = {"results_dir": args.results_dir, "tracking": {"uri": None}}
    uri = tracking_uri(config)
    latest = latest_by_stage(stage_runs(uri, args.experiment))
    systems = args.systems or sorted({r.tags["asrflow.system"] for r in latest.values()
                                      if r.stage.startswith("score-") and "asrflow.system" in r.tags})
    tests = args.tests or sorted({r.tags["asrflow.test_set"] for r in latest.values()
                                  if r.stage.startswith("score-") and "asrflow.test_set" in r.tags},
                                 key=lambda t: (t != "test", t))
    if not systems or not tests:
        raise FileNotFoundError(f"no scored systems in MLflow experiment {args.experiment!r} at {uri}")
    rows = system_rows(latest, systems, tests)
    header, body = table(rows, tests)
    text = markdown(header, body)
    print(text, end="")
    out = Path(args.out or Path(config["results_dir"]) / args.experiment / "compare")
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.md").write_text(f"# {args.experiment}: systems compared (from MLflow)\n\n{text}")
    (out / "table.csv").write_text(csv_text(header, body))
    (out / "table.html").write_text(html(header, body, f"{args.experiment}: systems compared"))
    if args.plots:
        from asrflow.report.plots import training_curves, wer_bars

        wer_bars(rows, tests, out / "wer.png")
        histories = {r.system: metric_history(uri, r.run_id, ("loss", "valid_loss"))
                     for r in rows if r.run_id and r.is_network}
        training_curves(histories, out / "training_curves.png")
    _log(f"written to {out}/")
    return 0


def cmd_bench_features(args: argparse.Namespace) -> int:
    from asrflow.features.bench import run_benchmark

    config = _load(args)
    report = run_benchmark(config, args.data, [int(w) for w in args.workers.split(",")], args.out,
                           repeats=args.repeats, log=_log)
    print(json.dumps(report, indent=2))
    return 0


def cmd_bench_gmm(args: argparse.Namespace) -> int:
    from asrflow.gmm.bench import run_benchmark

    config = _load(args)
    report = run_benchmark(config, args.data, args.features, args.lang, args.model, args.train,
                           [int(w) for w in args.workers.split(",")], repeats=args.repeats, log=_log)
    text = json.dumps(report, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    return 0


def cmd_bench_nnet(args: argparse.Namespace) -> int:
    import torch

    from asrflow.nnet.bench import run_benchmark, table

    config = _load(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    paths = {"train": args.train, "data": args.data, "features": args.features, "gmm": args.gmm, "lang": args.lang}
    frames = [int(f) for f in args.max_frames.split(",")] if args.max_frames else [None]
    try:
        rows = run_benchmark(config, args.systems, paths, args.epochs, frames, args.out, log=_log)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    print(table(rows))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="asrflow", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    def with_config(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("--config", "-c", nargs="+", required=True, metavar="YAML",
                       help="config files; later ones overlay earlier ones")
        return p

    p = with_config(sub.add_parser("config", help="validate a config and print or write it resolved"))
    p.add_argument("--out", help="write the resolved config here instead of printing it")
    p.set_defaults(func=cmd_config)

    p = with_config(sub.add_parser("data", help="import a corpus into validated Kaldi data dirs"))
    p.add_argument("--out", required=True, help="output folder (results/<exp>/data)")
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
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_lang)

    p = with_config(sub.add_parser("gmm", help="train a GMM-HMM system (mono, tri or sat) on Dask"))
    p.add_argument("--system", required=True, choices=list(GMM_SYSTEMS))
    p.add_argument("--train", required=True)
    p.add_argument("--data", required=True)
    p.add_argument("--features", required=True,
                   help="MFCC features folder (sat: the fmllr stage's folder of the tri system)")
    p.add_argument("--lang", required=True)
    p.add_argument("--source", help="the folder of the system whose alignments start this one (tri: mono; sat: tri)")
    p.add_argument("--out", required=True)
    p.add_argument("--workers", type=int, default=None)
    p.set_defaults(func=cmd_gmm)

    p = with_config(sub.add_parser("align", help="force-align a split with a trained GMM system on Dask"))
    p.add_argument("--system", required=True, choices=["mono", "tri"])
    p.add_argument("--gmm", required=True, help="the GMM system's folder")
    p.add_argument("--split", required=True, help="the split to align (e.g. train_sp: speed-perturbed copies)")
    for name in ("data", "features", "lang", "out"):
        p.add_argument(f"--{name}", required=True)
    p.add_argument("--workers", type=int, default=None)
    p.set_defaults(func=cmd_align)

    p = with_config(sub.add_parser("fmllr", help="speaker-adapted (fMLLR) features of a training split and its "
                                                 "test splits with a trained GMM system, on Dask"))
    p.add_argument("--system", required=True, choices=list(GMM_SYSTEMS))
    p.add_argument("--train", required=True)
    p.add_argument("--gmm", required=True, help="the GMM system's folder")
    p.add_argument("--graph", required=True, help="its HCLG folder (first decoding pass of the test speakers)")
    p.add_argument("--alignments", help="align folder of the speed-perturbed copies (adapted too when given)")
    p.add_argument("--init", help="fmllr folder whose transforms each speaker starts from (sat: the tri's)")
    for name in ("data", "features", "lang", "out"):
        p.add_argument(f"--{name}", required=True)
    p.add_argument("--workers", type=int, default=None)
    p.set_defaults(func=cmd_fmllr)

    p = sub.add_parser("graph", help="build HCLG for a trained GMM system, or TLG for phone CTC networks")
    p.add_argument("--lang", required=True)
    p.add_argument("--model", help="GMM system folder: build its HCLG")
    p.add_argument("--ctc", action="store_true", help="build TLG for CTC networks over the lang's phones")
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_graph)

    p = with_config(sub.add_parser("nnet", help="train a network of nnet.models (run it under torchrun)"))
    p.add_argument("--system", required=True, help="a name in nnet.models")
    for name in ("train", "data", "features", "out"):
        p.add_argument(f"--{name}", required=True)
    p.add_argument("--gmm", help="GMM system folder with the alignments (hybrid)")
    p.add_argument("--alignments", help="align stage folder: that GMM's alignments of <train>_sp (speed_perturb)")
    p.add_argument("--graph", help="its HCLG folder (bundled into the MLflow model of a hybrid network; the MMI denominator)")
    p.add_argument("--lang", help="lang folder (its LM is bundled into the MLflow model of a CTC network)")
    p.add_argument("--init", help="the trained network folder the weights start from (the model's init)")
    p.add_argument("--state", help="folder for the resumable training state (default: <out>/state)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads, shared by the local processes")
    p.set_defaults(func=cmd_nnet)

    p = with_config(sub.add_parser("ensemble", help="combine trained hybrid networks into an ensemble network"))
    p.add_argument("--system", required=True, help="an ensemble in nnet.models")
    p.add_argument("--members", nargs="+", required=True, help="the members' network folders, in config order")
    for name in ("train", "features", "gmm", "graph", "lang", "out"):
        p.add_argument(f"--{name}", required=True)
    p.set_defaults(func=cmd_ensemble)

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
    p.add_argument("--workers", type=int, default=None)
    p.set_defaults(func=cmd_tune)

    p = with_config(sub.add_parser("score", help="score a decoded test split"))
    for name in ("system", "test", "data", "decode", "lang", "out"):
        p.add_argument(f"--{name}", required=True)
    p.set_defaults(func=cmd_score)

    p = sub.add_parser("compare", help="table of an experiment's systems from MLflow (Markdown and CSV)")
    p.add_argument("experiment", help="experiment name (the MLflow experiment)")
    p.add_argument("--config", "-c", nargs="+", metavar="YAML", help="config giving tracking.uri / results_dir")
    p.add_argument("--results-dir", default="results", help="where results/mlflow.db is (without --config)")
    p.add_argument("--systems", nargs="*", help="systems in this order (default: every scored one)")
    p.add_argument("--tests", nargs="*", help="test sets in this order (default: every scored one)")
    p.add_argument("--out", help="folder for table.md / table.csv (default results/<experiment>/compare)")
    p.add_argument("--plots", action="store_true", help="also draw wer.png and training_curves.png")
    p.set_defaults(func=cmd_compare)

    bench = sub.add_parser("bench", help="benchmarks").add_subparsers(dest="what", required=True)
    p = with_config(bench.add_parser("features", help="feature x-real-time vs workers and kaldi-native-fbank"))
    p.add_argument("--data", required=True, help="data stage folder")
    p.add_argument("--workers", default="1,2", help="comma-separated worker counts")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per setting (best is kept)")
    p.add_argument("--out", default=None, help="write the JSON report here")
    p.set_defaults(func=cmd_bench_features)
    p = with_config(bench.add_parser("gmm", help="E-step speed vs Dask workers, alignment RTF"))
    for name in ("data", "features", "lang", "model"):
        p.add_argument(f"--{name}", required=True)
    p.add_argument("--train", default="train")
    p.add_argument("--workers", default="1,2")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=None)
    p.set_defaults(func=cmd_bench_gmm)

    p = with_config(bench.add_parser("nnet", help="training throughput of networks, FLOPs and % of the device's peak"))
    p.add_argument("--systems", nargs="+", required=True, help="names in nnet.models")
    for name in ("data", "features"):
        p.add_argument(f"--{name}", required=True)
    p.add_argument("--train", default="train")
    p.add_argument("--gmm", help="GMM system folder with the alignments (hybrid networks)")
    p.add_argument("--lang", help="lang folder (CTC over phones)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--max-frames", help="comma-separated batch sizes in frames (default: each network's own)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for torch")
    p.add_argument("--out", default=None, help="append the JSON rows to this file")
    p.set_defaults(func=cmd_bench_nnet)

    sub.add_parser("launch", help="start a training command's learners: torchrun, or srun + torchrun across nodes "
                   "(asrflow launch --learners N --nodes M -- asrflow nnet ...)", add_help=False)

    from asrflow.parallel.cli import register

    register(sub, bench, with_config)
    return parser


def main(argv: list[str] | None = None) -> int:
    from asrflow.corpus import CorpusError
    from asrflow.corpus.download import DownloadError
    from asrflow.data.audio import AudioError
    from asrflow.data.datadir import DataDirError
    from asrflow.nnet import NnetError
    from asrflow.parallel import ParallelError

    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["launch"]:  # its own parser: everything after `--` is the training command
        from asrflow.cluster.launch import main as launch

        return launch(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as exc:
        print(f"asrflow: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (CorpusError, DownloadError, DataDirError, AudioError, NnetError, ParallelError, FileNotFoundError) as exc:
        print(f"asrflow: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
