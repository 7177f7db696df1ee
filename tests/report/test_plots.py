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


def test_the_scale_table_shows_each_size_and_the_ratio_of_the_largest_to_the_base() -> None:
    from asrflow.scale.run import scale_table

    lines = [stage_line("realign", h, 2.0 * h * (1.5 if h == 100 else 1), 1.0, 100 + h, 500.0, utterances=1)
             for h in (10.0, 100.0)] + [stage_line("lang", 10.0, 1.0, 1.0, 200.0, None)]
    lines.insert(0, stage_line("lang", 10.0, 1.0, 1.0, 200.0, None))  # an earlier line: the latest counts
    table = scale_table(lines).splitlines()
    assert table[0].startswith("| stage | s per hour at 10 / 100 h | 100 h / 10 h |")
    assert table[2] == "| realign | 2.00 / 3.00 | 1.50 | 110 / 200 | 1.82 | 500 / 500 | 1.00 |"  # in the order they run
    assert table[3] == "| lang | 0.10 / – | – | 200 / – | – | – / – | – |"


def test_the_tradeoff_plot_reads_the_bench_rows(tmp_path: Path) -> None:
    from asrflow.cli import main

    rows = tmp_path / "networks.jsonl"
    rows.write_text('{"system": "tdnn", "wer": 0.48, "rtf": 0.12, "parameters": 7230357}\n'
                    '{"system": "tdnn_svd", "wer": 0.46, "rtf": 0.09, "parameters": 2177869}\n')
    assert main(["bench", "networks", "-c", "config/config.yaml", "--rows", str(rows)]) == 0
    assert (tmp_path / "networks.png").stat().st_size > 10_000
