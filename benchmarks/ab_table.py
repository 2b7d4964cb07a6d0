"""Median start-up stages of two trees' cold starts, run alternately on one machine by h200_session.sh.

    python benchmarks/ab_table.py <folder> <side A> <side B> [<label A> <label B>]

Reads <folder>/<side>_<i>/cold_start.json for runs i = 1..3 (run 0 filled the caches), prints cold_start.py's
median table with one column per side, then every run's cold start.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cold_start import summarize, table  # noqa: E402


def runs(folder: Path, side: str) -> list[dict]:
    found = [folder / f"{side}_{i}" / "cold_start.json" for i in (1, 2, 3)]
    return [json.loads(f.read_text())["rows"]["field"]["runs"][0] for f in found if f.exists()]


def main() -> None:
    folder, a, b = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    labels = sys.argv[4:6] if len(sys.argv) >= 6 else [a, b]
    sides = {label: runs(folder, side) for label, side in zip(labels, (a, b))}
    print(table({label: summarize(side_runs) for label, side_runs in sides.items()}))
    print("cold per run:", {label: [r.get("cold_start_to_first_step_s") for r in side_runs]
                            for label, side_runs in sides.items()})


if __name__ == "__main__":
    main()
