#!/usr/bin/env bash
# Run the whole suite on the oldest torch and transformers that setup.py accepts, in ./.venv-floor.
# This is how the floors are known to hold; CI runs the suite on the pinned current torch only.
# PyPI's torch wheels for these releases are CUDA builds (about 3 GB with their nvidia-* packages);
# they run the suite on CPU all the same. Extra arguments go to pytest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
floor() { sed -n "s/^ *\"$1>=\([0-9.]*\)\",.*/\1/p" "$ROOT/setup.py"; }
TORCH_FLOOR="$(floor torch)"
TRANSFORMERS_FLOOR="$(floor transformers)"
[ -n "$TORCH_FLOOR" ] && [ -n "$TRANSFORMERS_FLOOR" ] || { echo "cannot read the floors from setup.py" >&2; exit 1; }
echo "[test_floor] torch ~= $TORCH_FLOOR.0, transformers ~= $TRANSFORMERS_FLOOR.0"
export VERL_VENV="${VERL_VENV:-$ROOT/.venv-floor}"
export VERL_TORCH_SPEC="torch~=$TORCH_FLOOR.0"
export VERL_PIN_SPECS="transformers~=$TRANSFORMERS_FLOOR.0 torch~=$TORCH_FLOOR.0"
exec bash "$ROOT/scripts/run_tests.sh" "$@"
