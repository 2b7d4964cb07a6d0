#!/usr/bin/env bash
# Make ./.venv with this package installed in place (editable) plus the `test` extra.
# Idempotent: a second run only checks that everything is there and returns in seconds.
#
# torch is pinned to the CPU wheel pip finds on these machines (2.13.0); an unpinned torch pulls a
# multi-GB CUDA build. On a GPU machine, install the torch build for your CUDA first and set
# VERL_TORCH_SPEC to it (e.g. VERL_TORCH_SPEC="torch==2.8.0"), or VERL_TORCH_SPEC=skip to keep yours.
# VERL_PIN_SPECS (space-separated requirement specs) holds packages at chosen versions; the floor
# check (scripts/test_floor.sh) pins every core dependency to its floor through it.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VERL_VENV:-$ROOT/.venv}"
TORCH_SPEC="${VERL_TORCH_SPEC:-torch==2.13.0}"
PIN_SPECS="${VERL_PIN_SPECS:-}"
PY="${PYTHON:-python3}"

if [ ! -x "$VENV/bin/python" ]; then
    echo "[setup_env] creating $VENV"
    "$PY" -m venv "$VENV"
fi
VPY="$VENV/bin/python"

# Fast path: the stamp records what was installed; skip pip when nothing changed since.
STAMP="$VENV/.verl-setup-stamp"
WANT="$(cat "$ROOT/setup.py" | sha1sum | cut -c1-12) $TORCH_SPEC $PIN_SPECS"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] \
    && "$VPY" -c "import verl, torch, pytest, pytest_timeout, xdist" 2>/dev/null; then
    echo "[setup_env] $VENV is up to date"
    exit 0
fi

"$VPY" -m pip install --quiet --upgrade pip setuptools wheel
if [ "$TORCH_SPEC" != "skip" ]; then
    echo "[setup_env] installing $TORCH_SPEC"
    "$VPY" -m pip install --quiet "$TORCH_SPEC"
fi
echo "[setup_env] installing verl (editable) with the test extra"
# shellcheck disable=SC2086  # PIN_SPECS is a list of specs
"$VPY" -m pip install --quiet -e "$ROOT[test]" $PIN_SPECS
echo "$WANT" > "$STAMP"
"$VPY" -c "import verl, torch; print(f'[setup_env] verl {verl.__version__}, torch {torch.__version__}')"
