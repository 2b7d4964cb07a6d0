"""One table (and JSON) for the runs of benchmarks/offload_e2e.sh: exit status, the offload each run
actually used (read from the plan main_ppo prints), s/step, peak GPU and host memory, and per profile
how many times slower the manual offload is than the plan's own choice.

    python benchmarks/offload_table.py OUT_DIR [--json OUT.json]

Reads OUT_DIR/<run>.rc, <run>.log and <run>.summary.json (benchmarks/summarize_run.py); a run that
logged no step still gets its row, with its exit status. OUT_DIR/host_used_peak_kb, when present, is the
whole machine's peak host memory in use while the runs shared it.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re

# A role row of verl.compat.format_plan: role, params, compute, scaler, attention, rm_pad, ckpt, offload p/o.
_ROLE_ROW = re.compile(r"^\s+(actor|critic|ref)\s+(\S+)\s+(\S+)\s+\S+\s+(\S+)\s+\S+\s+\S+\s+(\S+/\S+)\s")


def plan_offload(log_path: str) -> dict[str, str]:
    """{role: "p/o"} from the first plan printed in the log, plus the actor's compute dtype and attention."""
    found: dict[str, str] = {}
    if not os.path.exists(log_path):
        return found
    with open(log_path, errors="replace") as f:
        for line in f:
            m = _ROLE_ROW.match(line)
            if m and m.group(1) not in found:
                found[m.group(1)] = m.group(5)
                if m.group(1) == "actor":
                    found["compute"], found["attention"] = m.group(3), m.group(4)
    return found


def row(out: str, name: str) -> dict:
    with open(os.path.join(out, f"{name}.rc")) as f:
        rc = int(f.read().strip() or -1)
    summary_path = os.path.join(out, f"{name}.summary.json")
    summary = json.load(open(summary_path)) if os.path.exists(summary_path) else {}
    memory = summary.get("memory_gb", {})
    timing = summary.get("timing_s", {})
    return {
        "run": name, "profile": name.split("_")[0], "exit": rc, "steps": summary.get("steps", 0),
        "plan": plan_offload(os.path.join(out, f"{name}.log")),
        "s_per_step": summary.get("s_per_step"), "first_step_s": summary.get("first_step_s"),
        "gen_s": timing.get("gen"), "update_critic_s": timing.get("update_critic"),
        "update_actor_s": timing.get("update_actor"),
        "predicted_peak_gb": memory.get("perf/predicted_peak_gb"),
        "max_memory_allocated_gb": memory.get("perf/max_memory_allocated_gb"),
        "max_memory_reserved_gb": memory.get("perf/max_memory_reserved_gb"),
        "cpu_memory_used_gb": memory.get("perf/cpu_memory_used_gb"),
    }


def ratios(rows: list[dict]) -> dict[str, float]:
    """Per profile: manual s/step over auto s/step (both runs exited 0)."""
    by_name = {r["run"]: r for r in rows}
    out = {}
    for r in rows:
        if r["run"].endswith("_manual"):
            auto = by_name.get(r["run"][: -len("manual")] + "auto")
            if auto and r["exit"] == 0 == auto["exit"] and r["s_per_step"] and auto["s_per_step"]:
                out[r["profile"]] = round(r["s_per_step"] / auto["s_per_step"], 2)
    return out


def _fmt(value) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}" if isinstance(value, float) else str(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out")
    parser.add_argument("--json")
    args = parser.parse_args()
    names = sorted(os.path.basename(p)[: -len(".rc")] for p in glob.glob(os.path.join(args.out, "*.rc")))
    rows = [row(args.out, n) for n in names]
    cols = ["run", "exit", "steps", "offload a/c/r (p/o)", "compute", "s/step", "first step", "gen", "update_critic",
            "update_actor", "predicted GiB", "GPU peak alloc GiB", "GPU reserved GiB", "host peak GiB"]
    print("| " + " | ".join(cols) + " |")
    print("|" + "---|" * len(cols))
    for r in rows:
        plan = r["plan"]
        offload = " ".join(plan.get(k, "-") for k in ("actor", "critic", "ref"))
        values = [r["run"], r["exit"], r["steps"], offload, f"{plan.get('compute', '-')}/{plan.get('attention', '-')}",
                  r["s_per_step"], r["first_step_s"], r["gen_s"], r["update_critic_s"], r["update_actor_s"],
                  r["predicted_peak_gb"], r["max_memory_allocated_gb"], r["max_memory_reserved_gb"],
                  r["cpu_memory_used_gb"]]
        print("| " + " | ".join(_fmt(v) for v in values) + " |")
    manual_over_auto = ratios(rows)
    print("manual / auto s/step: " + (", ".join(f"{k} {v}x" for k, v in manual_over_auto.items()) or "-"))
    result = {"runs": rows, "manual_over_auto_s_per_step": manual_over_auto}
    machine_peak = os.path.join(args.out, "host_used_peak_kb")  # offload_e2e.sh's sampler, all runs at once
    if os.path.exists(machine_peak):
        with open(machine_peak) as f:
            result["host_used_peak_gb_all_runs"] = round(int(f.read().strip()) / 1024**2, 2)
        print(f"host memory in use, peak over all runs together: {result['host_used_peak_gb_all_runs']} GiB")
    print(json.dumps(result))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
