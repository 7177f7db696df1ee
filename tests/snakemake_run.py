"""Run Snakemake on the repository's workflow from a test (the yesno experiment, locally or on Slurm)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
YESNO = REPO / "config" / "experiments" / "yesno.yaml"


#: Seconds a workflow run may take before the test stops it: a bound for a hung run, not a speed check (the
#: suite's time is measured in docs/benchmarks.md). The local yesno run took 1,480 s on a 2-vCPU machine
#: beside the Slurm run and the unit tests, and would have been stopped by a 1,500-s bound.
TIMEOUT = 3000


def snakemake(workdir: Path, *args: str, check: bool = True, timeout: float = TIMEOUT) -> subprocess.CompletedProcess:
    """``python -m snakemake -s REPO/Snakefile ARGS`` in ``workdir``, with this interpreter's venv first on PATH."""
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("ASRFLOW_PARENT_RUN_ID", None)
    env.pop("ASRFLOW_TRACKING_SPOOL", None)
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), *args],
                          cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        pytest.fail(f"snakemake {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def jobs_planned(output: str) -> set[str]:
    """Rule names of the jobs a (dry) run lists."""
    return set(re.findall(r"^(?:local)?rule (\w+):", output, flags=re.M))
