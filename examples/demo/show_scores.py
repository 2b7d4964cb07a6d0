"""Print the demo's learning curve from the file logger's JSON lines (one line per step)."""
from __future__ import annotations

import json
import sys

COLUMNS = ("critic/score/mean", "response_length/mean", "actor/pg_loss", "timing_s/step")


def read_steps(path: str) -> list[tuple[int, dict]]:
    with open(path) as f:
        records = [json.loads(line) for line in f if line.strip()]
    return [(r["step"], r["data"]) for r in records if "critic/score/mean" in r["data"]]


def main(path: str) -> int:
    steps = read_steps(path)
    if not steps:
        print(f"no training steps in {path}")
        return 1
    print(f"{'step':>5} " + " ".join(f"{c:>22}" for c in COLUMNS))
    for step, data in steps:
        cells = [f"{data[c]:>22.3f}" if isinstance(data.get(c), (int, float)) else f"{'-':>22}" for c in COLUMNS]
        print(f"{step:>5} " + " ".join(cells))
    first, last = steps[0][1]["critic/score/mean"], steps[-1][1]["critic/score/mean"]
    print(f"\nmean training score: {first:.3f} at step {steps[0][0]} -> {last:.3f} at step {steps[-1][0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
