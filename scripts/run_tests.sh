#!/usr/bin/env bash
# The test command of the README: set up ./.venv (if needed) and run the whole suite on CPU.
# Extra arguments go to pytest, e.g. `bash scripts/run_tests.sh tests/trainer -x`.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup_env.sh"
cd "$ROOT"
if [ "$#" -eq 0 ]; then set -- tests; fi
exec "${VERL_VENV:-$ROOT/.venv}/bin/python" -m pytest -q "$@"
