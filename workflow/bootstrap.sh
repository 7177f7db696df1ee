#!/usr/bin/env bash
# Set up a fresh machine and run asrflow:
#   bash workflow/bootstrap.sh run    [snakemake args]   # the default experiment (FSDD)
#   bash workflow/bootstrap.sh test   [pytest args]      # the test suite (what .ci/run calls); -n 0: one process
#   bash workflow/bootstrap.sh lint   [ruff args]        # ruff check . (also called by .ci/run)
# Creates .venv (or $ASRFLOW_VENV) and installs the pinned package when needed. Corpora are downloaded from
# their canonical sources unless ASRFLOW_DATA_MIRROR names a local mirror of them.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
root=$PWD
venv=${ASRFLOW_VENV:-$root/.venv}
python=${PYTHON:-python3}

if [ ! -x "$venv/bin/python" ]; then
  echo "asrflow: creating virtual environment $venv" >&2
  "$python" -m venv "$venv"
fi
stamp="$venv/.asrflow-installed"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "asrflow: installing asrflow and its pinned dependencies into $venv (a few minutes the first time)" >&2
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -e ".[test]" 2>&1 \
    | grep -v "is ignored: it is neither a file nor a directory" >&2 || true
  "$venv/bin/python" -c "import asrflow, torch, mlflow, snakemake, distributed" \
    || { echo "asrflow: installation failed" >&2; exit 1; }
  touch "$stamp"
fi
export PATH="$venv/bin:$PATH"

# Corpora: the local mirror named by ASRFLOW_DATA_MIRROR, else the recipes download them.
if [ -n "${ASRFLOW_DATA_MIRROR:-}" ]; then
  echo "asrflow: using the corpus mirror $ASRFLOW_DATA_MIRROR" >&2
fi

command=${1:-}
[ $# -gt 0 ] && shift
case "$command" in
  run)  exec snakemake --cores all "$@" ;;
  # pytest-xdist: a worker per core (at most 4); the workflow runs, which share the yesno run, stay in one
  # worker (--dist loadgroup) while the others take the unit tests into the cores those runs leave idle
  test) exec python -m pytest -q --numprocesses auto --maxprocesses 4 --dist loadgroup "$@" ;;
  lint)
    if ! python -m ruff --version >/dev/null 2>&1; then
      echo "asrflow: ruff is not installed in $venv (it comes with the test extras: pip install -e \".[test]\")" >&2
      exit 1
    fi
    exec python -m ruff check . "$@" ;;
  *)    echo "usage: bash workflow/bootstrap.sh run|test|lint [args]" >&2; exit 2 ;;
esac
