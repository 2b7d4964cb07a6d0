"""Median start-up stages of two trees' cold starts, run alternately on one machine by h200_session.sh.

    python benchmarks/ab_table.py <folder> <side A> <side B> [<label A> <label B>]

Reads <folder>/<side>_<i>/cold_start.json for runs i = 1..3 (run 0 filled the caches) and prints a table of
each stage's median per side, then every run's cold start.
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def runs(folder: Path, side: str) -> list[dict]:
    out = []
    for i in (1, 2, 3):
        f = folder / f"{side}_{i}" / "cold_start.json"
        if f.exists():
            r = json.loads(f.read_text())["rows"]["field"]["runs"][0]
            if r.get("startup"):
                out.append({"cold": r["cold_start_to_first_step_s"], "first_step": r["first_step_s"], **r["startup"]})
    return out


def main() -> None:
    folder, a, b = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    labels = sys.argv[4:6] if len(sys.argv) >= 6 else [a, b]
    rows = {a: runs(folder, a), b: runs(folder, b)}
    keys: list[str] = []
    for side_runs in rows.values():
        for r in side_runs:
            keys += [k for k in r if k not in keys]
    print(f"| median of runs 1-3, s | {labels[0]} | {labels[1]} |\n|---|---|---|")
    for k in keys:
        cells = []
        for side in (a, b):
            values = [r[k] for r in rows[side] if k in r]
            cells.append(f"{statistics.median(values):.2f}" if values else "")
        print(f"| {k} | " + " | ".join(cells) + " |")
    print("cold per run:", {side: [r["cold"] for r in side_runs] for side, side_runs in rows.items()})


if __name__ == "__main__":
    main()
