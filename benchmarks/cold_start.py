"""Cold start of the stock `python -m verl.trainer.main_ppo`: wall time to the first step, and where it goes.

Each run launches main_ppo in a fresh process (its own Ray instance) and measures the wall time from
launch to the first step's line in the file logger's JSONL (as benchmarks/speed.py does). The first
step's record also carries the trainer's own breakdown, `timing_s/startup` and `timing_s/startup/<stage>`
(see verl/utils/startup.py): stages in order, worker-side pieces of `init_models`, and work overlapped
on a thread. Prints one table (median over `--repeat` runs per stage) and writes cold_start.json.

Shapes: `field` is the field report's (batch 1, 256+256 tokens, filter_overlong_prompts) under the
simulated P40 profile where a GPU is present (benchmarks/speed.py's P40 row); `quickstart` is
upstream's quick-start shape (batch 256, 512+512). Both read the whole GSM8K train and test sets.

    # H200 (the lead's command; .gpu-assets holds tok/ and gsm8k/*.parquet):
    python benchmarks/cold_start.py --shapes field,quickstart --repeat 2 --out cold_start_out
    # CPU (a 2-layer, 64-wide model with the real Qwen vocabulary and tokenizer; 16 new tokens):
    python benchmarks/cold_start.py --shapes field --cpu-model /tmp/qwen-tiny --response-length 16 \
        --assets /work/main/.gpu-assets --repeat 3

The model defaults to /tmp/qwen05b-random (built by build_qwen_shaped.py when missing) on a GPU;
`--cpu-model DIR` builds/uses the CPU-sized stand-in instead.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from launch import launch_main_ppo  # noqa: E402
from speed import P40, QUICKSTART, common  # noqa: E402

STARTUP = "timing_s/startup"


def shape_overrides(name: str, gpu: bool, response_length: int | None) -> list[str]:
    if name == "field":
        extra = [o for o in P40 if gpu or not o.startswith("compat.device=")]
    elif name == "quickstart":
        extra = list(QUICKSTART)
    else:
        raise SystemExit(f"unknown shape {name!r}: choose field or quickstart")
    if response_length is not None:
        extra = [o for o in extra if not o.startswith("data.max_response_length=")]
        extra.append(f"data.max_response_length={response_length}")
    return extra


def run_once(name: str, overrides: list[str], out: Path, timeout: int) -> dict:
    """One main_ppo run to the end of its first step; the cold start and the first record's breakdown."""
    jsonl, log = out / f"{name}.jsonl", out / f"{name}.log"
    row = launch_main_ppo([*overrides, "trainer.total_training_steps=1"], jsonl, log, timeout)
    row.pop("wall_s")
    records = [json.loads(line)["data"] for line in jsonl.read_text().splitlines()] if jsonl.exists() else []
    first = next((r for r in records if "timing_s/step" in r), None)
    if first is None:
        row["log_tail"] = log.read_text()[-3000:]
        return row
    row["first_step_s"] = round(first["timing_s/step"], 2)
    row["startup"] = {k.removeprefix(STARTUP).lstrip("/") or "total": round(v, 3)
                      for k, v in first.items() if k.startswith(STARTUP)}
    return row


def summarize(runs: list[dict]) -> dict:
    ok = [r for r in runs if r.get("startup")]
    if not ok:
        return {"runs": runs}

    def median(values):
        values = [v for v in values if v is not None]
        return round(statistics.median(values), 2) if values else None

    stages: list[str] = []
    for r in ok:
        stages += [s for s in r["startup"] if s not in stages]
    return {"runs": runs,
            "cold_start_to_first_step_s": median([r["cold_start_to_first_step_s"] for r in ok]),
            "first_step_s": median([r["first_step_s"] for r in ok]),
            "startup_s": {s: median([r["startup"].get(s) for r in ok]) for s in stages}}


def table(rows: dict) -> str:
    names = list(rows)
    stages: list[str] = []
    for r in rows.values():
        stages += [s for s in r.get("startup_s", {}) if s not in stages]
    lines = ["| stage (median s) | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for key, label in (("cold_start_to_first_step_s", "**cold start to first step (wall)**"),
                       ("first_step_s", "first step (timing_s/step)")):
        lines.append(f"| {label} | " + " | ".join(str(rows[n].get(key)) for n in names) + " |")
    for stage in stages:
        label = "**start-up total (timing_s/startup)**" if stage == "total" else stage
        lines.append(f"| {label} | " + " | ".join(str(rows[n].get("startup_s", {}).get(stage, "")) for n in names)
                     + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="field", help="comma-separated: field, quickstart")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--assets", default=os.environ.get("ASSETS", ".gpu-assets"),
                        help="folder with tok/ and gsm8k/{train,test}.parquet")
    parser.add_argument("--model", default=os.environ.get("MODEL", "/tmp/qwen05b-random"))
    parser.add_argument("--cpu-model", default=None,
                        help="use (and build when missing) a 2-layer, 64-wide model with the real tokenizer here")
    parser.add_argument("--response-length", type=int, default=None, help="override the shape's response length")
    parser.add_argument("--timeout", type=int, default=600, help="per run, seconds")
    parser.add_argument("--out", default="cold_start_out")
    parser.add_argument("extra", nargs="*", help="more Hydra overrides for every run")
    args = parser.parse_args()

    import torch

    gpu = torch.cuda.is_available()
    device = torch.cuda.get_device_name() if gpu else "cpu"
    model = args.cpu_model or args.model
    if not (Path(model) / "config.json").exists():
        size = ["--layers", "2", "--hidden", "64"] if args.cpu_model else []
        subprocess.run([sys.executable, str(ROOT / "benchmarks" / "build_qwen_shaped.py"), model,
                        "--tokenizer", f"{args.assets}/tok", *size], check=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = {}
    for shape in [s for s in args.shapes.split(",") if s]:
        overrides = common(args.assets, model) + shape_overrides(shape, gpu, args.response_length) + args.extra
        runs = []
        for i in range(args.repeat):
            run = run_once(f"{shape}_{i}", overrides, out, args.timeout)
            print(f"{shape} run {i + 1}/{args.repeat}: exit {run['exit']}, cold start "
                  f"{run['cold_start_to_first_step_s']} s, start-up {run.get('startup', {}).get('total')} s, "
                  f"first step {run.get('first_step_s')} s", flush=True)
            runs.append(run)
        rows[shape] = summarize(runs)
    md = f"# Cold start on {device}\n\n" + table(rows)
    (out / "cold_start.json").write_text(json.dumps({"device": device, "rows": rows}, indent=1))
    (out / "cold_start.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
