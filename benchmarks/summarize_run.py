"""Summarise a training run from the file logger's JSON lines: s/step, timing breakdown, memory (GPU and host).

    python benchmarks/summarize_run.py RUN.jsonl [--name NAME] [--json OUT.json]

The first step carries warm-up (allocator growth, kernel selection), so s/step is the median of the
steps after it when there are any.
"""
from __future__ import annotations

import argparse
import json
import math
import statistics

TIMINGS = ("gen", "reward", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor", "step")
MEMORY = ("perf/predicted_peak_gb", "perf/max_memory_allocated_gb", "perf/max_memory_reserved_gb",
          "perf/cpu_memory_used_gb")


def _finite(value) -> bool:
    """A logged number is finite (non-finite norms are logged as the strings "nan" / "inf")."""
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def summarize(path: str) -> dict:
    with open(path) as f:
        steps = [json.loads(line)["data"] for line in f if line.strip()]
    steps = [s for s in steps if "timing_s/step" in s]
    if not steps:
        raise SystemExit(f"{path}: no training steps logged")
    timed = steps[1:] or steps

    def median(key):
        values = [s[key] for s in timed if isinstance(s.get(key), (int, float))]
        return round(statistics.median(values), 3) if values else None

    return {
        "steps": len(steps),
        "s_per_step": median("timing_s/step"),
        "first_step_s": round(steps[0]["timing_s/step"], 3),
        "timing_s": {k: median(f"timing_s/{k}") for k in TIMINGS},
        "memory_gb": {k: max((s[k] for s in steps if isinstance(s.get(k), (int, float))), default=None)
                      for k in MEMORY},
        # the allocator's peak so far, as logged at each step (it never resets: a step logged after a
        # validation carries that validation's peak)
        "max_allocated_gb_by_step": [s.get("perf/max_memory_allocated_gb") for s in steps],
        # each worker call's own allocator peak (perf/max_memory_allocated_gb/<phase>), largest over the run
        "phase_peak_gb": {k.rsplit("/", 1)[-1]: max(s[k] for s in steps if isinstance(s.get(k), (int, float)))
                          for k in sorted({k for s in steps for k in s
                                           if k.startswith("perf/max_memory_allocated_gb/")})},
        # steps whose optimizer step was skipped on a non-finite gradient norm: a timing measured there
        # has no optimizer step in it, and nothing was learned
        "skipped_updates": {role: sum(1 for s in steps if f"{role}/grad_norm" in s and not _finite(s[f"{role}/grad_norm"]))
                            for role in ("actor", "critic")},
        "score_first_last": (steps[0].get("critic/score/mean"), steps[-1].get("critic/score/mean")),
        "response_length_mean": median("response_length/mean"),
        "throughput_tokens_per_s": median("perf/throughput"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path")
    parser.add_argument("--name", default="")
    parser.add_argument("--json")
    args = parser.parse_args()
    summary = {"name": args.name or args.path, **summarize(args.path)}
    print(f"{summary['name']}: {summary['steps']} steps, {summary['s_per_step']} s/step "
          f"(first {summary['first_step_s']} s), throughput {summary['throughput_tokens_per_s']} tok/s")
    print("  " + "  ".join(f"{k}={v}" for k, v in summary["timing_s"].items()))
    print("  " + "  ".join(f"{k.split('/')[-1]}={v}" for k, v in summary["memory_gb"].items()))
    skipped = {k: v for k, v in summary["skipped_updates"].items() if v}
    if skipped:
        print(f"  WARNING: optimizer steps skipped on a non-finite grad norm: {skipped} of {summary['steps']} steps")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
