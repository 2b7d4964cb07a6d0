#!/usr/bin/env bash
# Adds TRL and accelerate wheels to .device-pack/wheels (made by ../shared/tools/device-pack.sh), so the
# GPU machine's `source .device-pack/install.sh` installs them and `benchmarks/speed.py`'s `trl` row runs
# TRL's GRPOTrainer beside ours. Both are pure-Python wheels; their other requirements (transformers,
# datasets, pandas, pyarrow, psutil, safetensors) are on the GPU image or in the pack already.
# The row's script was checked on CPU with trl 1.16.0 and accelerate 1.15.0 on a tiny Qwen2 model.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -d .device-pack/wheels ] || { echo "make the pack first: bash ../shared/tools/device-pack.sh" >&2; exit 1; }
python3 -m pip download -q --no-deps -d .device-pack/wheels "trl==1.16.*" "accelerate>=1.10.1"
ls .device-pack/wheels | grep -E "^(trl|accelerate)-"
