"""One rank of the two-rank checkpoint round trip in test_checkpoint.py (launched as a plain process).

Usage: RANK=.. WORLD_SIZE=.. MASTER_ADDR=.. MASTER_PORT=.. python ckpt_runner.py MODEL_DIR CKPT_DIR OUT_JSON
Trains one step, saves, trains another (the perturbation), loads, and reports whether this rank's
shards, optimizer state and LR came back exactly.
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from test_checkpoint import perturb_and_restore  # noqa: E402
from worker_setup import close_process_group  # noqa: E402


if __name__ == "__main__":
    torch.set_num_threads(1)
    result = perturb_and_restore(sys.argv[1], sys.argv[2])
    with open(sys.argv[3], "w") as f:
        json.dump(result, f)
    close_process_group()
