"""``asrflow bench features|gmm|decode|networks|sparse|mmi|scale|nnet`` (``parallel``: :mod:`asrflow.cli.parallel`)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from asrflow.cli.common import _load, _log, with_config
from asrflow.config import ConfigError


def json_lines(rows: list[dict], out: str | None) -> int:
    """Print one JSON line per row, and append them to ``out`` if given; the command's exit status."""
    lines = [json.dumps(r) for r in rows]
    if out:
        with open(out, "a", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in lines))
    print("\n".join(lines))
    return 0


def cmd_bench_features(args: argparse.Namespace) -> int:
    """Benchmark feature extraction speed vs Dask workers; print the JSON report."""
    from asrflow.features.bench import run_benchmark

    config = _load(args)
    report = run_benchmark(config, args.data, [int(w) for w in args.workers.split(",")], args.out,
                           repeats=args.repeats, log=_log)
    print(json.dumps(report, indent=2))
    return 0


def cmd_bench_gmm(args: argparse.Namespace) -> int:
    """Benchmark the GMM E-step vs Dask workers and the alignment RTF; print the JSON report."""
    from asrflow.gmm.bench import run_benchmark

    config = _load(args)
    report = run_benchmark(config, args.data, args.features, args.lang, args.model, args.train,
                           [int(w) for w in args.workers.split(",")], repeats=args.repeats, log=_log)
    text = json.dumps(report, indent=2)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    return 0


def cmd_bench_decode(args: argparse.Namespace) -> int:
    """Benchmark a GMM's decoding (RTF and WER per beam and acoustic scale); print one JSON line per setting."""
    from asrflow.gmm.bench import decode_benchmark

    config = _load(args)
    searches = [(float(b), int(m)) for b, m in (pair.split(":") for pair in args.searches.split(","))]
    rows = decode_benchmark(config, args.model, args.graph, args.data, args.features, args.lang, args.test, args.every,
                            searches, [float(s) for s in args.scales.split(",")], args.adapted, args.lattice,
                            args.vector, log=_log)
    return json_lines(rows, args.out)


def cmd_bench_networks(args: argparse.Namespace) -> int:
    """Time trained networks' decoding on one core (forward pass and search apart); one JSON line per network."""
    from asrflow.decode.bench import network_benchmark
    from asrflow.workflow import nnet_decode_inputs

    if args.rows:  # a figure of rows measured before (e.g. by several runs of the bench)
        from asrflow.report.plots import tradeoff_plot

        tradeoff_plot([json.loads(line) for line in Path(args.rows).read_text().splitlines() if line.strip()],
                      args.plot or str(Path(args.rows).with_suffix(".png")))
        return 0
    config = _load(args)
    batches = [int(b) for b in args.batch_frames.split(",")] if args.batch_frames else None
    if args.untrained:
        from asrflow.decode.bench import forward_benchmark

        return json_lines([forward_benchmark(config, system, nnet_decode_inputs(config, args.test, system), args.test,
                                             args.every, batches or [config["nnet"]["decode"]["batch_frames"]],
                                             log=_log)
                           for system in args.systems], args.out)
    rows = [network_benchmark(config, system, nnet_decode_inputs(config, args.test, system), args.test, args.every,
                              counted=args.count, batches=batches, device=args.device, precision=args.precision,
                              lattice=args.lattice, vector=args.vector, log=_log)
            for system in args.systems]
    json_lines(rows, args.out)
    if args.plot:
        from asrflow.report.plots import tradeoff_plot

        tradeoff_plot(rows, args.plot)
    return 0


def cmd_bench_sparse(args: argparse.Namespace) -> int:
    """Dense against CSR sparse matrix products of a pruned layer; one JSON line per pruned fraction."""
    from asrflow.nnet.prune import sparse_speed

    rows = sparse_speed(args.rows, args.cols, args.frames, [float(f) for f in args.fractions.split(",")],
                        args.repeats)
    return json_lines(rows, args.out)


def cmd_bench_mmi(args: argparse.Namespace) -> int:
    """The MMI denominator's forward-backward time for each denominator asked for; one JSON line each."""
    import torch

    from asrflow.gmm.model import GmmModel
    from asrflow.nnet.mmi import denominator_from_fst, denominator_speed, load_denominator_graph
    from asrflow.nnet.numerator import numerator_speed
    from asrflow.nnet.phone_lm import phone_lm_graph

    torch.set_num_threads(args.threads)
    model = GmmModel.load(args.gmm)
    num_pdfs = int(model.tid2pdf.max()) + 1
    rows = []
    for name in args.denominators.split(","):
        kind, _, order = name.partition(":")
        if kind == "graph":
            if not args.graph:
                raise SystemExit("bench mmi: the denominator 'graph' needs --graph (the folder of HCLG.fst)")
            graph = load_denominator_graph(Path(args.graph) / "HCLG.fst", model.tid2pdf)
        elif kind == "phone_lm" and order.isdigit():
            if not args.lang:
                raise SystemExit(f"bench mmi: the denominator {name!r} needs --lang (the lang folder of its phones)")
            graph = denominator_from_fst(phone_lm_graph(args.lang, args.gmm, model, int(order))[0], model.tid2pdf)
        else:
            raise SystemExit(f"bench mmi: unknown denominator {name!r} (graph or phone_lm:<order>)")
        rows.append({"denominator": name, "states": graph.num_states, "arcs": graph.num_arcs, "pdfs": num_pdfs,
                     "batch": args.batch, "frames": args.frames, "threads": args.threads,
                     **denominator_speed(graph, num_pdfs, args.batch, args.frames, args.repeats)})
        if args.tolerance is not None:
            rows[-1]["tolerance"] = args.tolerance
            rows[-1]["numerator_ms_per_frame"] = numerator_speed(num_pdfs, args.batch, args.frames, args.tolerance,
                                                                 args.repeats)
    return json_lines(rows, args.out)


def cmd_bench_scale(args: argparse.Namespace) -> int:
    """Every stage's time and memory on a training split grown to each size; one JSON line per stage and size."""
    from asrflow.scale.run import scale_benchmark

    config = _load(args)
    stages = args.stages.split(",") if args.stages else None
    try:
        lines = scale_benchmark(config, args.data, args.features, args.lang, args.model, args.train,
                                [float(h) for h in args.hours.split(",")], args.workers, log=_log, stages=stages,
                                audio_cache=args.audio_cache, test=args.test, test_minutes=args.test_minutes,
                                tune_utterances=args.tune_utterances)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    return json_lines(lines, args.out)


def cmd_bench_scale_plot(args: argparse.Namespace) -> int:
    """Plot the scale benchmark's JSON lines (time per hour and peak memory against hours, per stage) and print
    them as a Markdown table."""
    from asrflow.report.plots import scale_plot
    from asrflow.scale.run import scale_table

    lines = [json.loads(line) for line in Path(args.lines).read_text().splitlines() if line.strip()]
    scale_plot(lines, args.out)
    _log(f"{args.out}: {len(lines)} lines")
    print(scale_table(lines, args.base), end="")
    return 0


def cmd_bench_nnet(args: argparse.Namespace) -> int:
    """Benchmark networks' training throughput; print the table."""
    import torch

    from asrflow.nnet.bench import run_benchmark, table

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.bare:
        return _bench_bare(args)
    missing = [f"--{name}" for name in ("config", "systems", "data", "features") if not getattr(args, name)]
    if missing:
        raise ConfigError(f"bench nnet needs {', '.join(missing)} (or --bare, on synthetic data)")
    config = _load(args)
    paths = {"train": args.train, "data": args.data, "features": args.features, "gmm": args.gmm, "lang": args.lang}
    frames = [int(f) for f in args.max_frames.split(",")] if args.max_frames else [None]
    try:
        rows = run_benchmark(config, args.systems, paths, args.epochs, frames, args.out, log=_log)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    print(table(rows))
    return 0


def _bench_bare(args: argparse.Namespace) -> int:
    """The trainer against a bare loop for model presets, on synthetic data; print the table."""
    from asrflow.config.settings import Training
    from asrflow.nnet.bare import default_steps, run_bare, run_data_path, table

    max_frames = int(args.max_frames or 64000)
    opts = Training.defaults(epochs=args.epochs, max_frames=max_frames, lr=1e-4, warmup_steps=10, patience=args.epochs,
                             loader_workers=args.workers, prefetch=max(2, 2 * args.workers), compile=args.compile,
                             log_every=10, checkpoint_minutes=10000.0)
    if args.data_only:
        run_data_path(args.frames, opts, args.out, log=lambda line: print(line))
        return 0
    try:
        rows = run_bare(args.presets.split(","), args.frames, opts, default_steps(args.frames, max_frames), args.out,
                        log=_log)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    print(table(rows))
    return 0


def register(sub: Any) -> Any:
    """Add ``bench {features,gmm,nnet}`` to the ``sub`` subparsers; return the ``bench`` subparsers."""
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
    p = with_config(bench.add_parser("decode", help="a GMM's decoding RTF (one core) and WER per beam and scale"))
    for name in ("data", "features", "lang", "model", "graph"):
        p.add_argument(f"--{name}", required=True)
    p.add_argument("--test", default="test")
    p.add_argument("--every", type=int, default=10, help="decode every n-th utterance (sorted ids)")
    p.add_argument("--searches", default="13:7000", help="comma-separated beam:max-active pairs")
    p.add_argument("--scales", default="0.1", help="comma-separated acoustic scales")
    p.add_argument("--adapted", action="store_true", help="--features holds fMLLR-adapted features (<gmm>_fmllr)")
    p.add_argument("--lattice", action="store_true", help="search the same likelihoods with Kaldi's lattice-faster "
                   "decoder too (gmm-latgen-faster's search, one-unit lattice): its time and the words that differ")
    p.add_argument("--vector", action="store_true", help="search the same scores through the graph held as a "
                   "VectorFst too (as read from disk; decoding holds it as a ConstFst): its time, the words that "
                   "differ")
    p.add_argument("--out", default=None, help="append the JSON lines to this file")
    p.set_defaults(func=cmd_bench_decode)

    p = with_config(bench.add_parser("networks", help="trained networks' decoding on one core: forward pass and search "
                                     "timed apart, size, WER, classes the search reads per frame"))
    p.add_argument("--systems", nargs="+", default=[], help="networks of nnet.models, trained (and tuned)")
    p.add_argument("--test", default="test")
    p.add_argument("--every", type=int, default=10, help="decode every n-th utterance (sorted ids)")
    p.add_argument("--count", type=int, default=0, help="utterances decoded again to count the classes the search "
                   "reads per frame (slow: a Python callback per score)")
    p.add_argument("--plot", help="draw WER against RTF and against parameters into this PNG file")
    p.add_argument("--rows", help="plot these JSON lines (from --out) instead of decoding")
    p.add_argument("--batch-frames", help="comma-separated padded frames per forward batch to time the forward pass "
                   "with as well (1: one utterance at a time)")
    p.add_argument("--lattice", action="store_true", help="hybrids: search the same scores with Kaldi's lattice-faster "
                   "decoder too (one-unit lattice): its time and the words that differ")
    p.add_argument("--device", choices=["cpu", "cuda", "auto"], help="run the forward pass here (the search stays on "
                   "the CPU); default: each network's nnet.decode.device")
    p.add_argument("--precision", choices=["float32", "bfloat16", "int8"], help="the forward pass's arithmetic; "
                   "default: each network's nnet.decode.precision")
    p.add_argument("--vector", action="store_true", help="search the same scores through the graph held as a "
                   "VectorFst too (as read from disk; decoding holds it as a ConstFst): its time, the words that "
                   "differ")
    p.add_argument("--untrained", action="store_true", help="time only the forward pass of each hybrid network as "
                   "configured, with random weights (no final.pt, no search), by --batch-frames: a network's "
                   "scoring cost before training it")
    p.add_argument("--out", default=None, help="append the JSON lines to this file")
    p.set_defaults(func=cmd_bench_networks)

    p = bench.add_parser("sparse", help="a pruned layer's matrix product dense and sparse (CSR), one thread")
    p.add_argument("--rows", type=int, default=640, help="output width")
    p.add_argument("--cols", type=int, default=1920, help="input width (a TDNN layer: channels x kernel)")
    p.add_argument("--frames", type=int, default=2000)
    p.add_argument("--fractions", default="0,0.5,0.7,0.9,0.95", help="comma-separated pruned fractions")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--out", default=None, help="append the JSON lines to this file")
    p.set_defaults(func=cmd_bench_sparse)

    p = bench.add_parser("mmi", help="the MMI denominator's forward-backward time per frame (word graph, phone LMs)")
    p.add_argument("--gmm", required=True, help="the GMM folder whose tree numbers the pdfs (and whose alignments "
                                                "the phone LMs are estimated on)")
    p.add_argument("--lang", default=None, help="the lang folder (phone LMs)")
    p.add_argument("--graph", default=None, help="the folder of the GMM's HCLG.fst (denominator 'graph')")
    p.add_argument("--denominators", default="phone_lm:2,phone_lm:3",
                   help="comma-separated: graph, phone_lm:<order>")
    p.add_argument("--batch", type=int, default=4, help="utterances per pass")
    p.add_argument("--frames", type=int, default=300, help="frames per utterance")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--tolerance", type=int, default=None,
                   help="also time a chain numerator with this slack (output frames) over the batch, a phone every "
                        "3 frames: the row's numerator_ms_per_frame")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=None, help="append the JSON lines to this file")
    p.set_defaults(func=cmd_bench_mmi)

    p = with_config(bench.add_parser("scale", help="every stage's time and memory as the training split grows"))
    for name in ("data", "features", "lang", "model"):
        p.add_argument(f"--{name}", required=True)
    p.add_argument("--train", default="train", help="the split to replicate")
    p.add_argument("--hours", default="3,10,30", help="comma-separated sizes in hours of audio")
    p.add_argument("--workers", type=int, default=2, help="Dask worker processes")
    p.add_argument("--stages", default=None, help="comma-separated stages to run, with those they need (default: "
                   "all of import,features,mono,realign,accumulate,tree,fmllr,alignments,nnet_read,lang,lang_20k,"
                   "decode,score,tune,mlflow)")
    p.add_argument("--audio-cache", default=None, help="where the sized corpora's perturbed audio is written once "
                   "and reused (the import stage; without it, sizes replicate the split's stored features)")
    p.add_argument("--test", default="test", help="the split of --data/--features every size decodes")
    p.add_argument("--test-minutes", type=float, default=30.0, help="minutes of --test to decode")
    p.add_argument("--tune-utterances", type=int, default=200, help="the tuning set's cap")
    p.add_argument("--out", default=None, help="append the JSON lines (one per stage and size: stage, hours, wall_s, "
                   "cpu_s, peak_rss_driver_mb, peak_rss_worker_mb, ...) to this file")
    p.set_defaults(func=cmd_bench_scale)

    p = bench.add_parser("scale-plot", help="plot bench scale's lines (time per hour, peak memory against hours) "
                         "and print their table")
    p.add_argument("lines", help="the JSON lines of bench scale (--out)")
    p.add_argument("out", help="the figure to write (PNG)")
    p.add_argument("--base", type=float, default=10.0, help="the size the largest is compared with in the table")
    p.set_defaults(func=cmd_bench_scale_plot)

    p = with_config(bench.add_parser("nnet", help="training throughput of networks, FLOPs and %% of the device's peak"),
                    required=False)
    p.add_argument("--systems", nargs="+", help="names in nnet.models")
    for name in ("data", "features"):
        p.add_argument(f"--{name}")
    p.add_argument("--train", default="train")
    p.add_argument("--gmm", help="GMM system folder with the alignments (hybrid networks)")
    p.add_argument("--lang", help="lang folder (CTC over phones)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--max-frames", help="comma-separated batch sizes in frames (default: each network's own)")
    p.add_argument("--threads", type=int, default=None, help="CPU threads for torch")
    p.add_argument("--out", default=None, help="append the JSON rows to this file")
    p.add_argument("--bare", action="store_true", help="model presets on synthetic data: the trainer against a bare "
                   "loop on the same model and batch shape, the data path alone, MFU (no corpus needed)")
    p.add_argument("--presets", default="dnn_6x2048,cnn_tdnn_20m,blstm_3x512,conformer_20m",
                   help="--bare: comma-separated model presets")
    p.add_argument("--frames", type=int, default=2_260_000, help="--bare: frames of synthetic data (one epoch)")
    p.add_argument("--workers", type=int, default=4, help="--bare: the trainer's loader_workers")
    p.add_argument("--compile", action="store_true", help="--bare: train through torch.compile")
    p.add_argument("--data-only", action="store_true", help="--bare: the data path alone, with and without "
                   "SpecAugment (no model)")
    p.set_defaults(func=cmd_bench_nnet)
    return bench
