"""Cold start of the stock `python -m verl.trainer.main_ppo`: wall time to the first step, and where it goes.

Each run launches main_ppo in a fresh process (its own Ray instance) and stops after one step. The wall time
runs from launch to the first step's record in the file logger's JSONL; that record carries the trainer's
own breakdown (`timing_s/startup/<stage>`, verl/utils/startup.py). Prints the median per stage over
`--repeat` runs. Shapes: `field` (the P40 row of speed.py; unsimulated on a CPU host) and `quickstart`.
The first run on a machine fills the bytecode and import-structure caches: report runs 2+.

    python benchmarks/cold_start.py --shapes field --repeat 3 --out DIR
    python benchmarks/cold_start.py --shapes field --cpu-model /tmp/qwen-tiny --response-length 16   # CPU
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402


def shape_overrides(name: str, gpu: bool, response_length: int | None) -> list[str]:
    shapes = {"field": [o for o in harness.P40 if gpu or not o.startswith("compat.device=")],
              "quickstart": harness.QUICKSTART}
    if name not in shapes:
        raise SystemExit(f"unknown shape {name!r}: choose {' or '.join(shapes)}")
    if response_length is None:
        return list(shapes[name])
    return [o for o in shapes[name] if not o.startswith("data.max_response_length=")] + [
        f"data.max_response_length={response_length}"]


def run_once(name: str, overrides: list[str], out: Path, timeout: int) -> dict:
    jsonl, log = out / f"{name}.jsonl", out / f"{name}.log"
    row = harness.launch_main_ppo([*overrides, "trainer.total_training_steps=1"], jsonl, log, timeout)
    steps = harness.steps_of(jsonl) if jsonl.exists() else []
    if not steps:
        return {**row, "log_tail": log.read_text()[-3000:]}
    return {**row, "first_step_s": round(steps[0]["timing_s/step"], 2), "startup": harness.startup_of(steps[0])}


def median_row(runs: list[dict]) -> dict:
    ok = [r for r in runs if r.get("startup")]
    stages = list(dict.fromkeys(s for r in ok for s in r["startup"]))

    def median(values):
        values = [v for v in values if v is not None]
        return round(statistics.median(values), 2) if values else None

    return {"runs": runs, "cold_start_to_first_step_s": median([r["cold_start_to_first_step_s"] for r in ok]),
            "first_step_s": median([r["first_step_s"] for r in ok]),
            "startup_s": {s: median([r["startup"].get(s) for r in ok]) for s in stages}}


def table(rows: dict) -> str:
    names = list(rows)
    stages = list(dict.fromkeys(s for r in rows.values() for s in r.get("startup_s", {})))
    lines = ["| stage (median s) | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for key in ("cold_start_to_first_step_s", "first_step_s"):
        lines.append(f"| {key} | " + " | ".join(str(rows[n].get(key)) for n in names) + " |")
    for stage in stages:
        lines.append(f"| startup/{stage} | " + " | ".join(str(rows[n]["startup_s"].get(stage, "")) for n in names) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="field", help="comma-separated: field, quickstart")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cpu-model", help="use (and build when missing) a 2-layer, 64-wide model with the real tokenizer")
    ap.add_argument("--response-length", type=int, help="override the shape's response length")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per run")
    ap.add_argument("--out", default="cold_start_out")
    ap.add_argument("extra", nargs="*", help="more Hydra overrides for every run")
    args = ap.parse_args(argv)
    import torch

    gpu = torch.cuda.is_available()
    model = harness.ensure_model(args.cpu_model, layers=2, hidden=64) if args.cpu_model else harness.ensure_model()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = {}
    for shape in [s for s in args.shapes.split(",") if s]:
        overrides = harness.common(model=model) + shape_overrides(shape, gpu, args.response_length) + args.extra
        runs = []
        for i in range(args.repeat):
            runs.append(run_once(f"{shape}_{i}", overrides, out, args.timeout))
            print(f"{shape} run {i + 1}/{args.repeat}: exit {runs[-1]['exit']}, cold start "
                  f"{runs[-1]['cold_start_to_first_step_s']} s", flush=True)
        rows[shape] = median_row(runs)
    (out / "cold_start.json").write_text(json.dumps(rows, indent=1))
    print(table(rows))
    return 0 if all(r["exit"] == 0 for row in rows.values() for r in row["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
