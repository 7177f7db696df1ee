"""A parallel-training study of one network: measured, predicted, simulated and emulated.

1. :func:`asrflow.parallel.bench.bench_parallel` measures each strategy's speedup with real
   learner processes on this machine, beside the timing model's prediction;
2. :func:`simulated_rows` projects each strategy to 1…64 learners, flat and in nodes, with
   the discrete-event simulator driven by the measured ``T_calc`` / ``T_merge`` and model size;
3. :func:`emulated_rows` trains n virtual learners in one process per strategy and gives the
   held-out frame accuracy after a fixed number of epochs versus n;
4. :func:`write_study` writes the rows (JSON lines), a Markdown summary and the figures
   (speedup, accuracy, bytes per step).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from asrflow.parallel.timing import StepTimes, predict_speedup


def predicted_rows(bench: list[dict[str, Any]], learners: list[int]) -> list[dict[str, Any]]:
    """The timing model's curve per uncompressed strategy from its measured step times."""
    rows = []
    for row in bench:
        if row["compression"] != "none":
            continue
        times = StepTimes(calc=row["t_calc"], transmit=row["t_transmit"], merge=row["t_merge"])
        rows += [{"strategy": row["strategy"], "learners": n,
                  "predicted_speedup": predict_speedup(row["strategy"], n, times)}
                 for n in learners]
    return rows


def simulated_rows(bench: list[dict[str, Any]], learners: list[int], network: Any, group_size: int,
                   steps: int = 200, jitter: float = 0.0) -> list[dict[str, Any]]:
    """Simulated speedups per uncompressed strategy, flat and in nodes of ``group_size``, from measured times.

    A row's ``k`` and ``overlap`` (kavg) carry over; ``jitter`` spreads every step's compute time
    (log-normal, this relative spread), which is what a blocking average waits for.
    """
    from asrflow.parallel.simulate import project

    model_bytes = max((r["bytes_per_step"] for r in bench if r["strategy"] == "ring" and r["compression"] == "none"),
                      default=None) or max((r["bytes_per_step"] for r in bench if r["strategy"] != "pipeline"),
                                           default=0.0)
    rows = []
    for row in bench:
        if row["compression"] != "none":
            continue
        layouts = [1] + ([group_size] if row["strategy"] == "hierarchical" else [])
        for nodes in layouts:
            counts = [n for n in learners if nodes == 1 or n % nodes == 0]
            kavg = {"k": row.get("k", 4), "overlap": bool(row.get("overlap"))} if row["strategy"] == "kavg" else {}
            # a pipeline's messages are a stage boundary's activations, the others' the model
            nbytes = row["bytes_per_step"] if row["strategy"] == "pipeline" else model_bytes
            for result in project(row["strategy"], counts, row["t_calc"], row["t_merge"], nbytes, network,
                                  group_size=nodes, steps=steps, jitter=jitter, **kavg):
                rows.append({**result.as_dict(), "model_bytes": nbytes, **kavg})
    return rows


def emulated_rows(config: dict[str, Any], system: str, train: str, data: str, features: str, gmm: str | None,
                  strategies: list[str], learners: list[int], epochs: int, compressions: list[str],
                  log: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Held-out frame accuracy after ``epochs`` epochs vs virtual learner count, per strategy (and compression).

    ``nnet.parallel`` gives kavg's ``k`` and ``overlap``, ``batch``, ``stale_lr`` and ``predict_weights``.
    """
    from asrflow.config.paths import Paths
    from asrflow.nnet.stage import train_options, training_data
    from asrflow.parallel.emulate import COMPRESSIBLE, emulate

    targets, train_set, valid_set, _ = training_data(config, system, train,
                                                     Paths(data=data, features=features, out=Path("."), gmm=gmm))
    opts = train_options(config, system).replace(epochs=epochs)
    model = config["nnet"]["models"][system]
    parallel = config["nnet"]["parallel"]
    rows = []
    single = None  # one learner is plain training whatever the strategy: run it once
    for strategy in strategies:
        for compression in compressions:
            if compression != "none" and strategy not in COMPRESSIBLE:
                continue
            # nnet.parallel.overlap
            overlap = bool(parallel["overlap"]) and strategy == "kavg" and compression == "none"
            for n in learners:
                group = parallel["group_size"] if strategy == "hierarchical" and n % parallel["group_size"] == 0 \
                    else 1
                if n == 1 and single is not None:
                    result = single
                else:
                    result = emulate(strategy, n, model, train_set, valid_set, targets.num_classes, opts,
                                     k=parallel["k"], group_size=group, compression=compression,
                                     batch=parallel["batch"], stale_lr=parallel["stale_lr"], overlap=overlap,
                                     predict_weights=parallel["predict_weights"])
                    single = result if n == 1 else single
                row = {**result.as_dict(), "strategy": strategy, "compression": compression, "source": "emulated",
                       **({"overlap": overlap} if strategy == "kavg" else {}),
                       **({"stale_lr": parallel["stale_lr"], "predict_weights": parallel["predict_weights"]}
                          if strategy == "pipeline" else {})}
                log(json.dumps(row))
                rows.append(row)
    return rows


def write_rows(rows: list[dict[str, Any]], path: Path) -> None:
    """One JSON object per line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def read_rows(path: Path) -> list[dict[str, Any]]:
    """Rows written by :func:`write_rows` (empty when the file is missing)."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.is_file() else []


def write_figures(out: Path, bench: list[dict], predicted: list[dict], simulated: list[dict],
                  emulated: list[dict], baseline_accuracy: float | None) -> list[Path]:
    """speedup.png, accuracy.png and bytes.png in ``out``."""
    from asrflow.parallel.plots import plot_accuracy, plot_bytes, plot_speedup

    measured = [{k: v for k, v in r.items() if k != "group_size"} for r in bench if r["compression"] == "none"]
    accuracy = [{**r, "source": "emulated", "strategy": r["strategy"] + ("" if r["compression"] == "none"
                                                                         else f" {r['compression']}")}
                for r in emulated]
    accuracy += [{"strategy": r["strategy"] + ("" if r["compression"] == "none" else f" {r['compression']}"),
                  "learners": r["learners"], "valid_frame_accuracy": r["valid_frame_accuracy"], "source": "measured"}
                 for r in bench if r.get("valid_frame_accuracy") is not None]
    if baseline_accuracy is not None:
        accuracy += [{"strategy": r["strategy"], "learners": 1, "valid_frame_accuracy": baseline_accuracy,
                      "source": "measured"} for r in measured]
    return [plot_speedup(measured, predicted, [r for r in simulated if r["group_size"] == 1] +
                         [r for r in simulated if r["group_size"] > 1], out / "speedup.png"),
            plot_accuracy(accuracy, out / "accuracy.png"),
            plot_bytes([{"strategy": r["strategy"], "compression": r["compression"],
                         "bytes_per_step": r["bytes_per_step"]} for r in bench], out / "bytes.png")]


def summary_markdown(bench: list[dict], baseline: dict, simulated: list[dict], emulated: list[dict]) -> str:
    """Markdown tables: measured vs predicted, bytes and accuracy; simulated speedups; emulated accuracy."""
    from asrflow.parallel.bench import table

    lines = ["## Measured on this machine (real learner processes, gloo on loopback)", "",
             f"Single learner: {baseline['train_seconds']:.1f} s training, held-out frame accuracy "
             f"{100 * (baseline.get('best_valid_frame_accuracy') or float('nan')):.2f} %.", "", "```",
             table(bench), "```", ""]
    if simulated:
        counts = sorted({r["learners"] for r in simulated})
        lines += ["## Simulated speedup (discrete-event model, measured T_calc / T_merge)", "",
                  "| strategy | learners per node | " + " | ".join(str(n) for n in counts) + " |",
                  "|---|---|" + "---|" * len(counts)]
        for key in sorted({(r["strategy"], r["group_size"]) for r in simulated}):
            by_n = {r["learners"]: r["speedup"] for r in simulated if (r["strategy"], r["group_size"]) == key}
            lines.append(f"| {key[0]} | {key[1]} | " + " | ".join(f"{by_n[n]:.2f}" if n in by_n else "–"
                                                                 for n in counts) + " |")
        lines.append("")
    if emulated:
        counts = sorted({r["learners"] for r in emulated})
        lines += ["## Emulated held-out frame accuracy % (virtual learners, same epochs)", "",
                  "| strategy | compression | " + " | ".join(str(n) for n in counts) + " |",
                  "|---|---|" + "---|" * len(counts)]
        for key in sorted({(r["strategy"], r["compression"]) for r in emulated}):
            by_n = {r["learners"]: r["valid_frame_accuracy"] for r in emulated
                    if (r["strategy"], r["compression"]) == key}
            lines.append(f"| {key[0]} | {key[1]} | " + " | ".join(f"{100 * by_n[n]:.2f}" if n in by_n else "–"
                                                                 for n in counts) + " |")
        lines.append("")
    return "\n".join(lines)
