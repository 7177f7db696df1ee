#!/usr/bin/env bash
# Set up a fresh machine and run asrflow. The README's two commands:
#   bash workflow/bootstrap.sh run    [snakemake args]   # the default experiment (FSDD)
#   bash workflow/bootstrap.sh test   [pytest args]      # the test suite (what .ci/run calls)
# Creates .venv (or $ASRFLOW_VENV) and installs the pinned package when needed.
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

# Corpora: a local mirror when one is there (as on the build machines), else downloads.
if [ -z "${ASRFLOW_DATA_MIRROR:-}" ] && [ -d "$root/../shared/corpora" ]; then
  export ASRFLOW_DATA_MIRROR="$root/../shared/corpora"
  echo "asrflow: using the corpus mirror $ASRFLOW_DATA_MIRROR" >&2
fi

# System packages: the synthesisers of the espeak and flite recipes (synthetic speakers), installed where
# missing when root. The program and its Debian package have the same name.
for program in espeak-ng flite; do
  command -v "$program" >/dev/null 2>&1 && continue
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "asrflow: installing $program (apt-get)" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q --no-install-recommends "$program" >/dev/null 2>&1 \
      || { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q --no-install-recommends "$program" >/dev/null 2>&1; } \
      || echo "asrflow: could not install $program; its recipe (and its tests) will not run" >&2
  else
    echo "asrflow: $program is not installed; its recipe needs it (as root: apt-get install $program)" >&2
  fi
done

command=${1:-}
[ $# -gt 0 ] && shift
case "$command" in
  run)  exec snakemake --cores all "$@" ;;
  test) exec python -m pytest -q "$@" ;;
  *)    echo "usage: bash workflow/bootstrap.sh run|test [args]" >&2; exit 2 ;;
esac
