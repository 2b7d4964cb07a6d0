"""What is allocated at each phase's peak? The real workers of one step (`worker_harness`), the second
step's phases each recorded by the CUDA allocator's history; replaying a phase's allocations and frees
finds its peak and the blocks live then, summed by where they were allocated. Next to each phase, the
plan's memory-model terms for it, so a term that is missing or too large shows.

    python benchmarks/peak_breakdown.py --model /tmp/qwen05b-random --profile p40 --shape field --algo ppo

CUDA only (the allocator's history); on CPU `memory_model.py` measures the phases.
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from memory_growth import SHAPES as GROWTH_SHAPES  # noqa: E402
from worker_harness import add_step_arguments, step_for  # noqa: E402

GiB = 1024**3
# memory_growth.py's shapes, plus gpu_matrix.py's cell (batch 8, 256 + 128, micro-batch 4, log-prob micro-batch 8)
SHAPES = {**GROWTH_SHAPES, "matrix": dict(batch=8, n=1, mini=8, micro=4, log_prob_micro=8, ref_micro=8, prompt=256,
                                          response=128)}
# the worker method of each phase -> the memory model's phase name
MODEL_PHASE = {"generate_sequences": "rollout", "compute_log_prob": "log_prob", "compute_ref_log_prob": "ref",
               "compute_values": "values", "update_critic": "critic_update", "update_actor": "actor_update"}


def _site(frames: list, top: int = 3) -> str:
    py = [f for f in frames if f["filename"].endswith(".py")]
    mine = [f for f in py if "/verl/" in f["filename"] or "benchmarks" in f["filename"]][:top]
    inner = py[:1]   # the innermost Python frame (torch's or transformers') says which op allocated
    shown = inner + [f for f in mine if f not in inner]
    return " < ".join(f"{Path(f['filename']).name}:{f['line']} {f['name']}" for f in shown) or "(no Python frame)"


def peak_of_trace(trace: list, start_bytes: int) -> tuple[int, collections.Counter]:
    """(peak bytes, live bytes by allocation site at the peak) from one device's allocator trace."""
    live: dict[int, tuple[int, str]] = {}
    total = peak = start_bytes
    at_peak: dict[int, tuple[int, str]] = {}
    for event in trace:
        action, addr, size = event["action"], event["addr"], event["size"]
        if action == "alloc":
            live[addr] = (size, _site(event.get("frames", [])))
            total += size
            if total > peak:
                peak, at_peak = total, dict(live)
        elif action == "free_completed" and addr in live:
            total -= live.pop(addr)[0]
    sites: collections.Counter = collections.Counter()
    for size, where in at_peak.values():
        sites[where] += size
    return peak, sites


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_step_arguments(p, SHAPES, algo="ppo", shape="field")
    args = p.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("peak_breakdown.py needs a CUDA device (the allocator's history)")
        return 2
    step = step_for(args, SHAPES, total_training_steps=3)
    w = step.w
    for phase in step.available():        # step 1: compiles, records graphs, creates the optimizer state
        step.call(phase)
    step.seed = 4
    terms = w.plan.memory.get("phases", {})
    out = {}
    for phase in step.available():
        torch.cuda.synchronize()
        start = torch.cuda.memory_allocated()
        torch.cuda.memory._record_memory_history(max_entries=2_000_000)
        step.call(phase)
        torch.cuda.synchronize()
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        trace = snap["device_traces"][torch.cuda.current_device()]
        peak, sites = peak_of_trace(trace, start)
        model_phase = MODEL_PHASE[phase]
        predicted = {k: v for k, v in (terms.get(model_phase) or {}).items() if v}
        print(f"\n{phase}: resident at start {start / GiB:.3f} GiB, peak {peak / GiB:.3f} GiB "
              f"(+{(peak - start) / GiB:.3f}); the plan's {model_phase}: {sum(predicted.values()):.3f} GiB")
        for where, nbytes in sites.most_common(8):
            print(f"  {nbytes / GiB:8.3f} GiB  {where}")
        print("  plan's terms: " + ", ".join(f"{k} {v:.3f}" for k, v in predicted.items()))
        out[phase] = {"start_gb": start / GiB, "peak_gb": peak / GiB, "predicted_terms": predicted,
                      "sites": [[k, v / GiB] for k, v in sites.most_common(20)]}
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
