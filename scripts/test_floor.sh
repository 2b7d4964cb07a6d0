#!/usr/bin/env bash
# Run the whole suite with every core dependency at the oldest release setup.py accepts, in
# ./.venv-floor: `pkg>=A.B` is installed as the newest A.B.x. This is how the floors are known to hold;
# CI runs the suite on current releases only. PyPI's torch wheels are CUDA builds (about 3 GB with
# their nvidia-* packages); they run the suite on CPU all the same. Extra arguments go to pytest.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PINS="$("${PYTHON:-python3}" - "$ROOT/setup.py" <<'PY'
import re, sys
block = re.search(r"INSTALL_REQUIRES = \[(.*?)\]", open(sys.argv[1]).read(), re.S).group(1)
for name, version in re.findall(r'"([A-Za-z0-9_.-]+)>=([0-9.]+)"', block):
    parts = version.split(".")
    print(f"{name}~={version}.0" if len(parts) == 2 else f"{name}~={parts[0]}.0")
PY
)"
[ -n "$PINS" ] || { echo "cannot read the floors from setup.py" >&2; exit 1; }
echo "[test_floor] pins:" $PINS
export VERL_VENV="${VERL_VENV:-$ROOT/.venv-floor}"
export VERL_TORCH_SPEC="$(echo "$PINS" | grep '^torch~=')"
export VERL_PIN_SPECS="$(echo $PINS)"
exec bash "$ROOT/scripts/run_tests.sh" "$@"
