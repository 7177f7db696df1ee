"""``asrflow compare``: the table (and figures) of an experiment's systems from MLflow."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from asrflow.cli.common import _load, _log


def cmd_compare(args: argparse.Namespace) -> int:
    """Print and write the table (and optionally plots) of an experiment's scored systems from MLflow."""
    from asrflow.report.compare import csv_text, html, markdown, system_rows, table
    from asrflow.tracking import tracking_uri
    from asrflow.tracking.journal import SPOOL_ENV, relay
    from asrflow.tracking.query import latest_by_stage, metric_history, stage_runs

    if args.config:
        config = _load(args)
    else:
        config = {"results_dir": args.results_dir, "tracking": {"uri": None}}
    uri = tracking_uri(config)
    if os.environ.get(SPOOL_ENV):  # in a workflow: the stages' journals not yet relayed first
        relay(config, os.environ[SPOOL_ENV])
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


def register(sub: Any) -> None:
    """Add ``compare`` to the ``sub`` subparsers."""
    p = sub.add_parser("compare", help="table of an experiment's systems from MLflow (Markdown and CSV)")
    p.add_argument("experiment", help="experiment name (the MLflow experiment)")
    p.add_argument("--config", "-c", nargs="+", metavar="YAML", help="config giving tracking.uri / results_dir")
    p.add_argument("--results-dir", default="results", help="where results/mlflow.db is (without --config)")
    p.add_argument("--systems", nargs="*", help="systems in this order (default: every scored one)")
    p.add_argument("--tests", nargs="*", help="test sets in this order (default: every scored one)")
    p.add_argument("--out", help="folder for table.md / table.csv (default results/<experiment>/compare)")
    p.add_argument("--plots", action="store_true", help="also draw wer.png and training_curves.png")
    p.set_defaults(func=cmd_compare)
