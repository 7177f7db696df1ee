"""Helpers shared by the ``asrflow`` sub-command modules: logging, config loading, ``--config``."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from asrflow.config import load_config

EXIT_USAGE = 2


def _log(message: str) -> None:
    """Print a progress line on stdout, flushed."""
    print(message, flush=True)


def _load(args: argparse.Namespace) -> dict[str, Any]:
    """The config of ``--config``: its files overlaid in order, validated and resolved."""
    return load_config(*args.config)


def with_config(p: argparse.ArgumentParser, required: bool = True) -> argparse.ArgumentParser:
    """Add the ``--config/-c`` option (required unless told otherwise) to ``p``; return ``p``."""
    p.add_argument("--config", "-c", nargs="+", required=required, metavar="YAML",
                   help="config files; later ones overlay earlier ones")
    return p


@contextmanager
def stage_cluster(config: dict[str, Any], workers: int | None, run: Any) -> Iterator[Any]:
    """The stage's Dask client (:func:`asrflow.cluster.dask_client`); when the stage's work is done, the peak
    memory of the driver and of the largest worker go to the log and to the stage run's metrics
    (``peak_rss_driver_mb``, ``peak_rss_worker_mb``: what a cluster job of the stage needs)."""
    from asrflow.cluster import dask_client, peak_memory

    with dask_client(config["dask"], workers, log=_log) as client:
        yield client
        peaks = peak_memory(client)
        _log(f"peak memory: driver {peaks['peak_rss_driver_mb']:.0f} MB, largest worker "
             f"{peaks['peak_rss_worker_mb']:.0f} MB")
        run.log_metrics(peaks)
