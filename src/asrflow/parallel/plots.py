"""Figures of parallel training for docs/parallel.md and the Snakemake report.

Every function takes plain row dicts (as read from the benchmark CSV/JSON files), draws
whatever rows there are, writes a PNG (Agg backend, like :mod:`asrflow.report.plots`) and
returns its path; with no rows at all the figure carries a "no data" note.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path

import numpy as np

COMPRESSIONS = ("none", "8bit", "1bit")


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _number(value) -> float | None:
    """``value`` as a finite float, or ``None`` (missing, empty, NaN or not a number)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _label(row: dict) -> str:
    """Series name of a row: its strategy, with the node size when learners are grouped."""
    group = _number(row.get("group_size"))
    strategy = str(row.get("strategy", "?"))
    return f"{strategy} ({int(group)}/node)" if group is not None and group > 1 else strategy


def _series(rows: list[dict], key: str) -> dict[str, list[tuple[float, float]]]:
    """Sorted ``(learners, rows[key])`` points per series label, skipping rows without both numbers."""
    series: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for row in rows:
        x, y = _number(row.get("learners")), _number(row.get(key))
        if x is not None and y is not None and x > 0:
            series[_label(row)].append((x, y))
    return {label: sorted(points) for label, points in series.items()}


def _colours(labels: list[str]) -> dict[str, tuple]:
    """One colour per label, in sorted label order, from the tab10/tab20 cycles."""
    plt = _pyplot()
    cmap = plt.get_cmap("tab10" if len(labels) <= 10 else "tab20")
    return {label: cmap(i % cmap.N) for i, label in enumerate(sorted(labels))}


def _no_data(ax) -> None:
    """Write a centred "no data" note on ``ax``."""
    ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes, fontsize=14, color="grey")


def _log2_learners(ax, xs: list[float]) -> None:
    """Log2 learner axis with a tick at every power of two in range."""
    ax.set_xscale("log", base=2)
    if xs:
        top = max(1, math.ceil(math.log2(max(xs))))
        ticks = [2**i for i in range(0, top + 1)]
        ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.set_xlabel("learners")


def _save(fig, plt, path: str | Path) -> Path:
    """Write ``fig`` as a PNG to ``path`` (creating its folder) and close it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_speedup(measured: list[dict], predicted: list[dict], simulated: list[dict], path: str | Path) -> Path:
    """Speedup vs learners: measured (markers), predicted by the timing model (dashed), simulated (solid).

    Rows carry ``strategy``, ``learners`` (and optionally ``group_size``) and
    ``measured_speedup`` / ``predicted_speedup`` / ``speedup`` respectively; one colour per
    strategy, the ideal ``y = x`` dotted, both axes log2.
    """
    plt = _pyplot()
    kinds = (
        ("measured", _series(measured, "measured_speedup"), dict(linestyle="none", marker="o", markersize=6)),
        ("predicted", _series(predicted, "predicted_speedup"), dict(linestyle="--", linewidth=1.2)),
        ("simulated", _series(simulated, "speedup"), dict(linestyle="-", linewidth=1.6)),
    )
    labels = sorted({label for _, series, _ in kinds for label in series})
    colours = _colours(labels)
    fig, ax = plt.subplots(figsize=(7, 4.8))
    xs = [x for _, series, _ in kinds for points in series.values() for x, _ in points]
    ys = [y for _, series, _ in kinds for points in series.values() for _, y in points if y > 0]
    if not xs:
        _no_data(ax)
    else:
        top = 2 ** math.ceil(math.log2(max(xs + [2])))
        ax.plot([1, top], [1, top], ":", color="black", linewidth=1, label="ideal", zorder=5)
        for _, series, style in kinds:
            for label, points in series.items():
                ax.plot(*zip(*points), color=colours[label], **style)
        ax.set_yscale("log", base=2)
        ax.set_ylim(bottom=min(ys + [1]) / 1.5, top=top * 1.5)
        for label in labels:
            ax.plot([], [], color=colours[label], linewidth=6, label=label)
        for name, _, style in kinds:
            ax.plot([], [], color="grey", label=name, **style)
        ax.legend(fontsize=7, ncol=2, loc="upper left")
        ax.grid(True, which="major", alpha=0.3)
    _log2_learners(ax, xs)
    ax.set_ylabel("speedup over one learner")
    ax.set_title("Parallel training speedup")
    return _save(fig, plt, path)


def plot_accuracy(rows: list[dict], path: str | Path) -> Path:
    """Held-out frame accuracy vs learners, one line per strategy (dashed/hollow when ``source`` is emulated)."""
    plt = _pyplot()
    grouped: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        grouped[str(row.get("source") or "measured")].append(row)
    per_source = {source: _series(group, "valid_frame_accuracy") for source, group in grouped.items()}
    colours = _colours(sorted({label for series in per_source.values() for label in series}))
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    xs: list[float] = []
    for source, series in sorted(per_source.items()):
        emulated = source == "emulated"
        for label, points in sorted(series.items()):
            xs.extend(x for x, _ in points)
            ax.plot(*zip(*points), color=colours[label], linestyle="--" if emulated else "-", marker="o",
                    markerfacecolor="none" if emulated else colours[label],
                    label=f"{label} ({source})" if len(per_source) > 1 else label)
    if xs:
        ax.legend(fontsize=7)
        ax.grid(True, alpha=0.3)
    else:
        _no_data(ax)
    _log2_learners(ax, xs)
    ax.set_ylabel("held-out frame accuracy")
    ax.set_title("Accuracy after training vs learners")
    return _save(fig, plt, path)


def plot_bytes(rows: list[dict], path: str | Path) -> Path:
    """Grouped bars of bytes sent per step: strategies along x, one bar per compression, log y.

    Repeated ``(strategy, compression)`` rows are averaged; non-positive values are left out.
    """
    plt = _pyplot()
    values: dict[tuple[str, str], list[float]] = defaultdict(list)
    for row in rows:
        value = _number(row.get("bytes_per_step"))
        if value is not None and value > 0:
            values[(str(row.get("strategy", "?")), str(row.get("compression", "none")))].append(value)
    strategies = sorted({s for s, _ in values})
    seen = {c for _, c in values}
    compressions = [c for c in COMPRESSIONS if c in seen] + sorted(seen - set(COMPRESSIONS))
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(strategies) * max(1, len(compressions)) / 2), 4))
    if values:
        width = 0.8 / len(compressions)
        x = np.arange(len(strategies))
        for i, compression in enumerate(compressions):
            heights = [np.mean(values[(s, compression)]) if (s, compression) in values else np.nan for s in strategies]
            ax.bar(x + i * width, heights, width, label=compression)
        ax.set_xticks(x + width * (len(compressions) - 1) / 2, strategies, rotation=20, ha="right", fontsize=8)
        ax.set_yscale("log")
        ax.legend(title="compression", fontsize=8)
    else:
        _no_data(ax)
        ax.set_xticks([])
    ax.set_ylabel("bytes sent per step")
    ax.set_title("Communication per step and learner")
    return _save(fig, plt, path)
