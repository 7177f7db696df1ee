"""The report's figures are drawn from their inputs."""

from __future__ import annotations

from pathlib import Path

from asrflow.report.plots import scale_plot
from asrflow.scale.size import stage_line


def test_the_scale_plot_draws_every_stage_from_the_latest_line_of_each_size(tmp_path: Path) -> None:
    lines = [stage_line(stage, hours, 10.0 * hours, 12.0 * hours, 100 + hours, worker, utterances=1)
             for hours in (3.0, 10.0, 30.0) for stage, worker in (("realign", 300.0), ("lang", None))]
    lines.append(stage_line("realign", 10.0, 1.0, 1.0, 120.0, 310.0))  # a rerun replaces the earlier line
    scale_plot(lines, tmp_path / "scale.png")
    assert (tmp_path / "scale.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert lines[0]["wall_s_per_hour"] == 10.0 and lines[1]["peak_rss_worker_mb"] is None
