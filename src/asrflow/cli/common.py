"""Helpers shared by the ``asrflow`` sub-command modules: logging, config loading, ``--config``."""

from __future__ import annotations

import argparse
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
