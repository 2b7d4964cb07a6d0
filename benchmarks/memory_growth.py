"""Does device memory grow from step to step? The real workers of one step (`worker_harness`), run for
several steps; after each, the memory still allocated, before and after a full garbage collection, and at
the end which live tensors (by shape and dtype) the later steps added.

Why: on the H200 the GRPO row's per-phase peaks rose by about one bf16 embedding matrix (0.25 GiB) a step.
Memory that only a collection frees is held by reference cycles; memory that survives it is held on purpose
(a cache) or leaked.

    python benchmarks/memory_growth.py --model /tmp/qwen05b-random --profile h200 --algo grpo --steps 6
"""
from __future__ import annotations

import argparse
import collections
import gc
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
from worker_harness import add_step_arguments, step_for  # noqa: E402

GiB = 1024**3
SHAPES = {"grpo": dict(batch=16, n=4, mini=8, micro=16, log_prob_micro=16, ref_micro=16, prompt=512, response=128),
          "field": dict(batch=1, n=1, mini=1, micro=1, log_prob_micro=1, ref_micro=1, prompt=256, response=256)}


def live_tensors(device_type: str) -> collections.Counter:
    """Bytes of live tensors on `device_type` by (shape, dtype), as the garbage collector sees them."""
    import torch

    census: collections.Counter = collections.Counter()
    seen = set()
    for obj in gc.get_objects():
        try:
            if not isinstance(obj, torch.Tensor) or obj.device.type != device_type:
                continue
            key = obj.untyped_storage().data_ptr()
        except Exception:   # noqa: BLE001 - objects that refuse inspection are not tensors we track
            continue
        if key in seen:
            continue
        seen.add(key)
        census[(tuple(obj.shape), str(obj.dtype).removeprefix("torch."))] += obj.untyped_storage().nbytes()
    return census


def allocation_sites(top: int = 4) -> collections.Counter:
    """Bytes of live device blocks by where they were allocated (the innermost `top` frames of this
    repository's or torch's Python code), from the allocator's snapshot; needs the allocation history
    to be recording (CUDA only)."""
    import torch

    sites: collections.Counter = collections.Counter()
    for segment in torch.cuda.memory._snapshot()["segments"]:
        for block in segment["blocks"]:
            if block["state"] != "active_allocated":
                continue
            frames = [f for f in block.get("frames", []) if f["filename"].endswith(".py")]
            mine = [f for f in frames if "/verl/" in f["filename"] or "benchmarks" in f["filename"]][:top]
            where = " < ".join(f"{Path(f['filename']).name}:{f['line']} {f['name']}" for f in (mine or frames[:top]))
            sites[where or "(no Python frame)"] += block["size"]
    return sites


def allocated(device) -> float:
    import torch

    return torch.cuda.memory_allocated(device) / GiB if device.type == "cuda" else 0.0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_step_arguments(p, SHAPES, algo="grpo", shape="grpo")
    p.add_argument("--steps", type=int, default=6)
    args = p.parse_args(argv)

    step = step_for(args, SHAPES, total_training_steps=args.steps + 1)
    w = step.w
    device_type = w.device.type
    if device_type == "cuda":
        import torch

        torch.cuda.memory._record_memory_history(max_entries=200_000)
    rows, censuses, cyclic, sites = [], [], [], []
    for i in range(args.steps):
        step.seed = 3 + i     # new prompts (and prompt widths) every step, as a data loader gives
        for phase in step.available():
            step.call(phase)
        before = allocated(w.device)
        if i in (1, args.steps - 1):
            held = live_tensors(device_type)
            cyclic.append(held)
        unreachable = gc.collect()
        after = allocated(w.device)
        rows.append({"step": i + 1, "allocated_gb": round(before, 3), "after_gc_gb": round(after, 3),
                     "gc_objects": unreachable})
        print(f"step {i + 1}: allocated {before:.3f} GiB, after gc.collect {after:.3f} GiB "
              f"({unreachable} unreachable objects)", flush=True)
        if i in (1, args.steps - 1):
            censuses.append(live_tensors(device_type))
            if device_type == "cuda":
                sites.append(allocation_sites())
    # what only a collection freed at the last step (held by reference cycles), and what survived it
    in_cycles = cyclic[-1] - censuses[-1] if cyclic else collections.Counter()
    print(f"live {device_type} tensors that gc.collect freed after step {args.steps} (held by reference cycles):")
    for (shape, dtype), nbytes in in_cycles.most_common(12):
        print(f"  {nbytes / GiB:8.4f} GiB  {dtype:9s} {list(shape)}")
    added = censuses[-1] - censuses[0] if len(censuses) == 2 else collections.Counter()
    print(f"live {device_type} tensors added between step 2 and step {args.steps} (after gc):")
    for (shape, dtype), nbytes in added.most_common(12):
        print(f"  {nbytes / GiB:8.4f} GiB  {dtype:9s} {list(shape)}")
    grown = sites[-1] - sites[0] if len(sites) == 2 else collections.Counter()
    print(f"live device blocks added between step 2 and step {args.steps}, by allocation site:")
    for where, nbytes in grown.most_common(10):
        print(f"  {nbytes / GiB:8.4f} GiB  {where}")
    if args.json:
        Path(args.json).write_text(json.dumps({"steps": rows,
                                               "added": [[list(k[0]), k[1], v] for k, v in added.most_common(40)],
                                               "in_cycles": [[list(k[0]), k[1], v] for k, v in in_cycles.most_common(40)],
                                               "sites": grown.most_common(20)},
                                              indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
