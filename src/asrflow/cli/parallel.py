"""Command-line side of :mod:`asrflow.parallel`: ``asrflow parallel predict|simulate|emulate`` and
``asrflow bench parallel`` (registered into the main parser by :func:`register`)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from asrflow.cli.common import with_config
from asrflow.parallel.timing import StepTimes, predict_speedup

DEFAULT_STRATEGIES = "allreduce,ring,kavg,adpsgd,hierarchical,asgd"


def _ints(text: str) -> list[int]:
    """The integers of a comma-separated list (``"1,2,4"``)."""
    return [int(x) for x in text.split(",") if x]


def _log(message: str) -> None:
    """Print a progress line on stderr (stdout carries the JSON rows), flushed."""
    print(message, file=sys.stderr, flush=True)


def times_from_run(run_id: str, tracking_uri: str | None) -> tuple[str, StepTimes]:
    """Strategy and mean step times of an MLflow nnet run (``mean_t_*`` metrics)."""
    from asrflow.tracking.query import run_record

    run = run_record(tracking_uri, run_id)
    metrics, params = run.metrics, run.params
    times = StepTimes(calc=metrics.get("mean_t_calc", 0.0) + metrics.get("mean_t_data", 0.0),
                      transmit=metrics.get("mean_t_transmit", 0.0), merge=metrics.get("mean_t_merge", 0.0),
                      bytes=metrics.get("mean_bytes_per_step", 0.0))
    return params.get("nnet.parallel.effective.strategy", "ring"), times


def cmd_predict(args: argparse.Namespace) -> int:
    """Print the timing model's speedup curve."""
    strategy = args.strategy
    if args.run:
        strategy_of_run, times = times_from_run(args.run, args.tracking_uri)
        strategy = strategy or strategy_of_run
    elif args.times:
        values = json.loads(Path(args.times).read_text())
        times = StepTimes.from_dict(values)
        strategy = strategy or values.get("strategy", "ring")
    else:
        if args.t_calc is None:
            raise SystemExit("asrflow parallel predict: give --run, --times or --t-calc/--t-transmit/--t-merge")
        times = StepTimes(calc=args.t_calc, transmit=args.t_transmit, merge=args.t_merge)
    strategy = strategy or "ring"
    from asrflow.parallel.timing import n_max

    print(f"# {strategy}: T_calc {times.calc * 1e3:.2f} ms, T_transmit {times.transmit * 1e3:.3f} ms, "
          f"T_merge {times.merge * 1e3:.2f} ms; RSPS n_max = {n_max(times):.1f}")
    for n in _ints(args.learners):
        print(json.dumps({"strategy": strategy, "learners": n,
                          "predicted_speedup": round(predict_speedup(strategy, n, times), 4)}))
    return 0


def _network(args: argparse.Namespace) -> Any:
    """The simulated network of the ``--bandwidth/--latency/--intra-*`` options."""
    from asrflow.parallel.simulate import Network

    return Network(bandwidth=args.bandwidth, latency=args.latency, intra_bandwidth=args.intra_bandwidth,
                   intra_latency=args.intra_latency)


def cmd_simulate(args: argparse.Namespace) -> int:
    """Simulated speedup per strategy; from a bench's measured times or from the given ones."""
    from asrflow.parallel.study import predicted_rows, read_rows, simulated_rows, write_figures, write_rows

    learners = _ints(args.learners)
    if args.bench:
        bench = read_rows(Path(args.bench))
    else:
        bench = [{"strategy": s, "compression": "none", "t_calc": args.t_calc, "t_merge": args.t_merge,
                  "t_transmit": 0.0, "k": args.k, "overlap": args.overlap,
                  "bytes_per_step": args.activation_bytes if s == "pipeline" and args.activation_bytes
                  else args.model_bytes}
                 for s in args.strategies.split(",")]
    rows = simulated_rows(bench, learners, _network(args), args.group_size, jitter=args.jitter)
    for row in rows:
        print(json.dumps(row))
    if args.out:
        out = Path(args.out)
        write_rows(rows, out / "simulate.jsonl")
        measured = bench if args.bench else []
        write_figures(out, measured, predicted_rows(measured, learners) if measured else [], rows, [], None)
        _log(f"wrote {out / 'simulate.jsonl'} and {out / 'speedup.png'}")
    return 0


def cmd_emulate(args: argparse.Namespace) -> int:
    """Emulated accuracy vs virtual learners per strategy."""
    import torch

    from asrflow.config import load_config
    from asrflow.parallel.study import emulated_rows, write_rows

    torch.set_num_threads(args.threads)
    config = load_config(*args.config)
    rows = emulated_rows(config, args.system, args.train, args.data, args.features, args.gmm,
                         args.strategies.split(","), _ints(args.learners), args.epochs, args.compressions.split(","),
                         log=print)
    if args.out:
        write_rows(rows, Path(args.out) / "emulate.jsonl")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    """Measured speedups (one JSON line per strategy and learner count) and the human-readable table;
    with ``--study`` also the simulation, the emulation and the figures."""
    from asrflow.parallel.bench import ROW_KEYS, bench_parallel, table
    from asrflow.parallel.study import (
        emulated_rows,
        predicted_rows,
        read_rows,
        simulated_rows,
        summary_markdown,
        write_figures,
        write_rows,
    )

    if not args.steps and not (args.data and args.features and args.gmm):
        raise SystemExit("asrflow bench parallel: give --data, --features and --gmm (a corpus split), "
                         "or --steps (a synthetic split)")
    if args.steps and args.study and args.emulate_learners != "none" and not args.data:
        raise SystemExit("asrflow bench parallel: the study's emulation trains on a corpus split; with --steps "
                         "give --data, --features and --gmm too, or --emulate-learners none")
    paths = {"train": args.train, "data": args.data, "features": args.features, "gmm": args.gmm}
    variants = [{"strategy": s, "group_size": args.group_size if s == "hierarchical" else 2, "batch": args.batch,
                 **({"k": args.k, "overlap": args.overlap} if s == "kavg" else {})} for s in args.strategies.split(",")]
    variants += [{"strategy": s, "compression": c, "batch": args.batch, **({"k": args.k} if s == "kavg" else {})}
                 for c in args.compressions.split(",")
                 if c != "none" for s in ("allreduce", "ring", "kavg") if s in args.strategies.split(",")]
    baseline, rows = bench_parallel(args.config, args.system, paths, variants, _ints(args.learners), args.epochs,
                                    args.threads, args.repeats, log=_log, trace_dir=args.trace,
                                    pairing=args.pairing, warmup=args.warmup, pin=args.pin, steps=args.steps,
                                    length=args.utterance_frames)
    for row in rows:
        print(json.dumps({k: row[k] for k in ROW_KEYS}))
    print(table(rows))
    if not args.out:
        return 0
    out = Path(args.out)
    write_rows(rows, out / "bench.jsonl")
    (out / "baseline.json").write_text(json.dumps(baseline, indent=1) + "\n")
    simulated = simulated_rows(rows, _ints(args.simulate_learners), _network(args), args.nodes) if args.study else []
    emulated = read_rows(out / "emulate.jsonl")
    if args.study and args.emulate_learners != "none":
        from asrflow.config import load_config

        emulated = emulated_rows(load_config(*args.config), args.system, args.train, args.data, args.features,
                                 args.gmm, args.strategies.split(","), _ints(args.emulate_learners), args.epochs,
                                 ["none"], log=_log)
        write_rows(emulated, out / "emulate.jsonl")
    write_rows(simulated, out / "simulate.jsonl")
    write_figures(out, rows, predicted_rows(rows, _ints(args.simulate_learners)), simulated, emulated,
                  baseline.get("best_valid_frame_accuracy"))
    (out / "summary.md").write_text(summary_markdown(rows, baseline, simulated, emulated))
    _log(f"wrote {out}/bench.jsonl, summary.md, speedup.png, accuracy.png, bytes.png")
    return 0


def _network_args(p: argparse.ArgumentParser) -> None:
    """Add the simulated network's options (:func:`_network`) to ``p``."""
    p.add_argument("--bandwidth", type=float, default=1.25e9, help="between nodes, bytes/s (default 10 Gbit/s)")
    p.add_argument("--latency", type=float, default=5e-5, help="between nodes, s")
    p.add_argument("--intra-bandwidth", type=float, default=2.5e10, help="inside a node, bytes/s")
    p.add_argument("--intra-latency", type=float, default=5e-6)


def register(sub: Any, bench: Any) -> None:
    """Add ``parallel {predict,simulate,emulate}`` to ``sub`` and ``parallel`` to the ``bench`` subparsers."""
    par = sub.add_parser("parallel", help="parallel training: timing model, simulator, convergence emulation")
    cmds = par.add_subparsers(dest="what", required=True)

    p = cmds.add_parser("predict", help="speedup predicted by the timing model from measured step times")
    p.add_argument("--run", help="an MLflow nnet run id (its mean_t_* metrics)")
    p.add_argument("--tracking-uri", help="MLflow tracking URI for --run (default: MLFLOW_TRACKING_URI)")
    p.add_argument("--times", help="JSON with t_calc, t_transmit, t_merge (e.g. a bench row)")
    p.add_argument("--t-calc", type=float)
    p.add_argument("--t-transmit", type=float, default=0.0)
    p.add_argument("--t-merge", type=float, default=0.0)
    p.add_argument("--strategy", help="default: the run's / the row's, else ring")
    p.add_argument("--learners", default="1,2,4,8,16,32,64")
    p.set_defaults(func=cmd_predict)

    p = cmds.add_parser("simulate", help="discrete-event projection of speedup to many learners")
    p.add_argument("--bench", help="bench.jsonl from asrflow bench parallel (measured times)")
    p.add_argument("--t-calc", type=float, default=0.1)
    p.add_argument("--t-merge", type=float, default=0.005)
    p.add_argument("--model-bytes", type=float, default=2.4e6)
    p.add_argument("--activation-bytes", type=float, help="pipeline: bytes of one stage boundary's activations of a "
                   "batch (default: --model-bytes)")
    p.add_argument("--strategies", default=DEFAULT_STRATEGIES)
    p.add_argument("--learners", default="1,2,4,8,16,32,64")
    p.add_argument("--group-size", type=int, default=8, help="learners per node for the hierarchical layout")
    p.add_argument("--k", type=int, default=4, help="kavg: local steps between averages (without --bench)")
    p.add_argument("--overlap", action="store_true", help="kavg: averages taken in one step late (without --bench)")
    p.add_argument("--jitter", type=float, default=0.0, help="relative spread of each step's compute time")
    p.add_argument("--out", help="folder for simulate.jsonl and speedup.png")
    _network_args(p)
    p.set_defaults(func=cmd_simulate)

    def data_args(p: argparse.ArgumentParser, required: bool = True) -> None:
        """Add the system, data and strategy options of ``emulate`` and ``bench parallel`` to ``p``."""
        p.add_argument("--system", default="dnn", help="a hybrid network of nnet.models")
        p.add_argument("--train", default="train")
        for name in ("data", "features", "gmm"):
            p.add_argument(f"--{name}", required=required)
        p.add_argument("--strategies", default=DEFAULT_STRATEGIES)
        p.add_argument("--threads", type=int, default=1, help="torch threads per learner")

    p = with_config(cmds.add_parser("emulate", help="accuracy vs virtual learners, one process"))
    data_args(p)
    p.add_argument("--learners", default="1,2,4,8")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--compressions", default="none")
    p.add_argument("--out")
    p.set_defaults(func=cmd_emulate)

    p = with_config(bench.add_parser("parallel", help="measured speedup of each strategy vs the timing model"))
    data_args(p, required=False)
    p.add_argument("--steps", type=int, help="timed minibatches per learner on a synthetic split of equal "
                   "utterances (no --data, --features, --gmm; one epoch); default: --epochs of the corpus split")
    p.add_argument("--warmup", type=int, default=3, help="steps of each run left out of the timing")
    p.add_argument("--utterance-frames", type=int, default=400, help="with --steps: frames per utterance")
    p.add_argument("--pin", action=argparse.BooleanOptionalAction, default=True,
                   help="each learner on a core of its own (os.sched_setaffinity)")
    p.add_argument("--compressions", default="none,1bit", help="also bench allreduce/ring/kavg with these")
    p.add_argument("--learners", default="1,2", help="learner processes (1 is the baseline)")
    p.add_argument("--group-size", type=int, default=1, help="hierarchical: learners per group in the bench")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch", choices=["global", "learner"], default="global",
                   help="nnet.parallel.batch: max_frames split over the learners, or max_frames each")
    p.add_argument("--repeats", type=int, default=5, help="paired runs (one learner, then the strategy) per "
                   "setting; the median speedup is kept, with its min-max and interquartile range")
    p.add_argument("--pairing", choices=["before", "concurrent"], default="before",
                   help="each pair's single learner runs before the parallel run, or at the same time on spare "
                   "cores (both see the same drift of the machine)")
    p.add_argument("--k", type=int, default=4, help="kavg: local steps between model averages")
    p.add_argument("--overlap", action="store_true", help="kavg: nnet.parallel.overlap (averages one step late)")
    p.add_argument("--trace", help="folder for every run's per-step times (<run>.rank<r>.jsonl)")
    p.add_argument("--out", help="folder for bench.jsonl (and the study's files)")
    p.add_argument("--study", action="store_true", help="also simulate and emulate, and draw the figures")
    p.add_argument("--simulate-learners", default="1,2,4,8,16,32,64")
    p.add_argument("--nodes", type=int, default=8, help="learners per node in the simulated hierarchical layout")
    p.add_argument("--emulate-learners", default="1,2,4,8", help="virtual learner counts (as many epochs as the "
                   "bench); none: no emulation")
    _network_args(p)
    p.set_defaults(func=cmd_bench)
