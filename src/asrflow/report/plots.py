"""Figures of the report: WER per system and test set, the networks' training curves, and speed and size against
WER."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from asrflow.report.compare import SystemRow


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def wer_bars(rows: list[SystemRow], tests: list[str], path: str | Path) -> None:
    """Grouped bars: WER (%) of each system on each test set."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(tests) * max(1, len(rows)) / 3), 4))
    width = 0.8 / max(1, len(rows))
    x = np.arange(len(tests))
    for i, row in enumerate(rows):
        ax.bar(x + i * width, [100 * row.wer.get(t, np.nan) for t in tests], width, label=row.system)
    ax.set_xticks(x + width * (len(rows) - 1) / 2, tests, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("WER (%)")
    ax.legend(fontsize=8)
    ax.set_title("Word error rate per system")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def training_curves(histories: dict[str, dict[str, list[tuple[int, float]]]], path: str | Path) -> None:
    """Training loss per step and held-out loss per epoch of each network (one panel each)."""
    plt = _pyplot()
    names = sorted(histories) or ["(no networks)"]
    fig, axes = plt.subplots(1, len(names), figsize=(4 * len(names), 3.2), squeeze=False)
    for ax, name in zip(axes[0], names):
        for metric, style in (("loss", "-"), ("valid_loss", "o-")):
            points = histories.get(name, {}).get(metric, [])
            if points:
                steps, values = zip(*sorted(points))
                ax.plot(steps, values, style, label=metric, markersize=3, linewidth=1)
        ax.set_title(name)
        ax.set_xlabel("step")
        ax.set_yscale("log")
        ax.legend(fontsize=8)
    axes[0][0].set_ylabel("loss")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def scale_plot(lines: list[dict], path: str | Path) -> None:
    """The scale benchmark's lines (``asrflow bench scale``): seconds per hour of audio, and the peak memory of
    the driver and of the largest worker, against hours, one line per stage (the latest line of each stage and
    size)."""
    from asrflow.scale.size import latest_lines

    plt = _pyplot()
    stages, latest = latest_lines(lines)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5), sharex=True)
    panels = (("wall_s_per_hour", "seconds per hour of audio"), ("peak_rss_driver_mb", "driver peak (MB)"),
              ("peak_rss_worker_mb", "largest worker peak (MB)"))
    for ax, (key, label) in zip(axes, panels):
        for i, stage in enumerate(stages):
            points = sorted((h, line[key]) for (s, h), line in latest.items() if s == stage and line[key] is not None)
            if points:
                ax.plot(*zip(*points), marker="o", linestyle="-" if i < 10 else "--", label=stage)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("hours of audio")
        ax.set_title(label)
    axes[0].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def tradeoff_plot(rows: list[dict], path: str | Path) -> None:
    """Two panels from ``asrflow bench networks`` rows: WER (%) against the decoding real-time factor (one core),
    and against the parameters, each network a labelled point."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, key, label in ((axes[0], "rtf", "decoding real-time factor (one core)"),
                           (axes[1], "parameters", "parameters (millions)")):
        for row in rows:
            x = row[key] / (1e6 if key == "parameters" else 1)
            ax.scatter(x, 100 * row["wer"], s=18)
            ax.annotate(row["system"], (x, 100 * row["wer"]), fontsize=7, xytext=(3, 3), textcoords="offset points")
        ax.set_xlabel(label)
        ax.set_ylabel("WER (%)")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
