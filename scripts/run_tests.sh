#!/usr/bin/env bash
# The test command of the README: set up ./.venv (if needed) and run the whole suite on CPU.
# The main suite runs on VERL_TEST_WORKERS pytest-xdist workers (default 2; 0 runs it in this process),
# each taking whole files (--dist loadfile), the end-to-end files first (tests/conftest.py).
# Extra arguments go to pytest, e.g. `bash scripts/run_tests.sh tests/trainer -x` (no workers unless you
# add `-n 2`).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$ROOT/scripts/setup_env.sh"
cd "$ROOT"
if [ "$#" -eq 0 ]; then
    # The whole suite: the main environment, then the vLLM engine's tests in their own (.venv-vllm).
    "${VERL_VENV:-$ROOT/.venv}/bin/python" -m pytest -q -n "${VERL_TEST_WORKERS:-2}" --dist loadfile tests
    exec bash "$ROOT/scripts/run_vllm_tests.sh"
fi
exec "${VERL_VENV:-$ROOT/.venv}/bin/python" -m pytest -q "$@"
