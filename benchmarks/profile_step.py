"""Where a training step's time goes: each phase timed, then run under the torch profiler (benchmarks/README.md).

Per (profile, setting, variant): a warm-up pass (`first s`), `--steps` timed passes (median), one profiled
pass on a slice (one mini-batch; `--profile-decode-steps` new tokens). Writes profile_step.{json,txt}, traces/.

    python benchmarks/profile_step.py --profiles h200 --settings quickstart,grpo --out DIR
    python benchmarks/profile_step.py --tiny --profiles cpu --out /tmp/prof     # CPU smoke
"""
from __future__ import annotations

import argparse
import gc
import gzip
import json
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402
from harness import ARR, SHAPES, shape  # noqa: E402
from worker_harness import PHASES, StepPhases, build_workers, stock_overrides  # noqa: E402

# Each setting: its shape, rollout.n and the algorithm's overrides; `tiny`, the shape for the tiny model (CPU).
SETTINGS = {
    "field": dict(shape=SHAPES["field_report"], n=1, algo=["algorithm.adv_estimator=gae"],
                  tiny=shape(1, 1, 1, 1, 1, 16, 8)),
    "quickstart": dict(shape=SHAPES["quickstart"], n=1, algo=["algorithm.adv_estimator=gae", "algorithm.kl_ctrl.kl_coef=0.001"],
                       tiny=shape(4, 2, 1, 2, 2, 16, 8)),
    "grpo": dict(shape=SHAPES["grpo"], n=4, algo=harness.GRPO_ALGO, tiny=shape(2, 1, 2, 2, 2, 16, 8)),
}
FAMILIES = ("gemm", "attention", "elementwise/other", "optimizer", "collectives", "memcpy/memset")
_PATTERNS = (   # first match wins: attention kernels are often cutlass too
    ("memcpy/memset", ("memcpy", "memset")),
    ("collectives", ("nccl", "c10d::", "gloo", "all_reduce", "allreduce", "all_gather", "allgather",
                     "reduce_scatter", "reducescatter", "broadcast_")),
    ("attention", ("flash", "fmha", "attention", "sdpa", "attn")),
    ("optimizer", ("adam", "multi_tensor_apply", "_foreach_", "foreach")),
    ("gemm", ("gemm", "xmma", "nvjet", "cublas", "cutlass", "matmul", "gemv", "splitk", "aten::mm", "aten::addmm",
              "aten::bmm", "aten::baddbmm")),
)
_SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")


def family(name: str) -> str:
    """The family of a kernel or op name (FAMILIES); what matches nothing is elementwise/other."""
    low = name.lower()
    return next((fam for fam, needles in _PATTERNS if any(n in low for n in needles)), "elementwise/other")


def _union_us(intervals: list[tuple[float, float]]) -> float:
    """Total length of the union of [start, end) intervals (kernels on several streams overlap)."""
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total


def device_summary(trace: dict, wall_s: float) -> dict:
    """Family totals, busy time and idle fraction from a chrome trace's device events (CUDA runs)."""
    fams = dict.fromkeys(FAMILIES, 0.0)
    intervals, kernels, syncs, sync_us = [], 0, 0, 0.0
    for ev in trace.get("traceEvents", []):
        cat, dur = ev.get("cat"), ev.get("dur")
        if cat in ("kernel", "gpu_memcpy", "gpu_memset") and dur is not None:
            name = ev.get("name", "")
            fams["memcpy/memset" if cat != "kernel" else family(name)] += dur
            intervals.append((ev["ts"], ev["ts"] + dur))
            kernels += cat == "kernel"
        elif cat == "cuda_runtime" and ev.get("name") in _SYNC_CALLS:
            syncs += 1
            sync_us += dur or 0.0
    return _summary(fams, _union_us(intervals) / 1e6, wall_s, kernels, syncs, sync_us)


def host_summary(averages, wall_s: float) -> dict:
    """The CPU-only run's stand-in: ops' self CPU time per family; busy = the ops' total self time."""
    fams = dict.fromkeys(FAMILIES, 0.0)
    for evt in averages:
        fams[family(evt.key)] += evt.self_cpu_time_total
    return _summary(fams, sum(fams.values()) / 1e6, wall_s)


def _summary(fams_us: dict, busy: float, wall_s: float, kernels: int = 0, syncs: int = 0, sync_us: float = 0.0) -> dict:
    return {"families_s": {k: round(v / 1e6, 6) for k, v in fams_us.items()}, "device_busy_s": round(busy, 6),
            "device_idle_fraction": round(max(0.0, 1 - busy / wall_s), 4) if wall_s > 0 else None,
            "kernels": kernels, "mean_kernel_us": round(sum(fams_us.values()) / kernels, 2) if kernels else None,
            "host_syncs": syncs, "host_sync_s": round(sync_us / 1e6, 6)}


def timed(fn, device) -> float:
    """Wall seconds of `fn`, between device synchronisations."""
    import torch

    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda _: None)
    sync(device)
    start = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - start


def profile_phase(fn, device, trace_path: Path, limit: int = 25) -> tuple[dict, str]:
    """Run `fn` once under the profiler; (summary, key_averages table of the `limit` costliest ops). The gzipped
    chrome trace is written to `trace_path`."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities, record_shapes=False, with_stack=False) as prof:
        wall = timed(fn, device)
    averages = prof.key_averages()
    sort = ("self_device_time_total" if hasattr(averages[0], "self_device_time_total") else "self_cuda_time_total") \
        if cuda else "self_cpu_time_total"
    table = averages.table(sort_by=sort, row_limit=limit, max_name_column_width=70)
    if cuda:     # where the host's time goes too (launch-bound phases show it here, not in kernel time)
        table += "\nhost side, by self CPU time:\n" + averages.table(
            sort_by="self_cpu_time_total", row_limit=max(limit // 2, 5), max_name_column_width=70)
    raw = trace_path.with_suffix("")        # the .json before gzip
    prof.export_chrome_trace(str(raw))
    trace_path.write_bytes(gzip.compress(raw.read_bytes()))
    trace = json.loads(raw.read_text())
    raw.unlink()
    summary = device_summary(trace, wall) if cuda else host_summary(averages, wall)
    summary.update(wall_s=round(wall, 4), host_ops=sum(e.count for e in averages if e.key.startswith("aten::")))
    torch.cuda.empty_cache()     # a no-op where CUDA never started
    return summary, table


def parse_variant(text: str) -> tuple[str, list[str]]:
    """`NAME=KEY=VALUE,KEY=VALUE` (or `NAME=` for no change): a variant's name and its Hydra overrides."""
    name, _, rest = text.partition("=")
    if not name or not all(c.isalnum() or c in "_-" for c in name):
        raise argparse.ArgumentTypeError(f"--variant {text!r}: expected NAME=KEY=VALUE[,KEY=VALUE...]")
    return name, [item for item in rest.split(",") if item]


def run_setting(profile: str, name: str, model: str, args, work: Path,
                variant: tuple[str, list[str]] = ("base", [])) -> tuple[dict, str]:
    """Build, warm up, time and profile one (profile, setting, variant); its JSON row and its text report."""
    import torch

    spec = SETTINGS[name]
    dims = spec["tiny"] if args.tiny else spec["shape"]
    overrides = stock_overrides(dims, profile, model) + [f"{ARR}.rollout.n={spec['n']}", *spec["algo"], *args.override,
                                                          *variant[1]]
    if args.eos_share > 0:
        overrides.append(f"{ARR}.rollout.ignore_eos=False")
    clock = time.perf_counter()
    w = build_workers(overrides)
    build_s = time.perf_counter() - clock
    real = None if args.prompt_tokens == "full" else tuple(int(x) for x in args.prompt_tokens.split(":"))
    if args.tiny and real is not None:
        real = (max(1, dims["prompt"] // 4), dims["prompt"])
    step = StepPhases(w, prompt=dims["prompt"], real_prompt=real, eos_share=args.eos_share)
    available = step.available()
    wanted = [p for p in (args.phases.split(",") if args.phases else PHASES) if p in available]
    device = w.device
    row = {"profile": profile, "setting": name, "variant": variant[0], "shape": dims, "n": spec["n"], "rows": w.rows,
           "mini_batch_rows": w.mini_rows, "prompt_tokens": args.prompt_tokens, "overrides": overrides,
           "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
           "torch": torch.__version__, "build_s": round(build_s, 1), "plan": w.plan.to_dict(), "phases": {}}

    clock = time.perf_counter()       # warm-up: the whole step once, each phase's first call timed
    first = {phase: timed(lambda: step.call(phase), device) for phase in available}
    row["warmup_s"] = round(time.perf_counter() - clock, 1)
    runs = {p: [] for p in wanted}
    for _ in range(args.steps):
        for phase in available:
            if phase in wanted:
                runs[phase].append(timed(lambda: step.call(phase), device))
                mfu = {k: v for k, v in step.metrics.get(phase, {}).items() if k.startswith("perf/mfu")}
                row["phases"].setdefault(phase, {}).update(mfu)
            elif phase == "generate_sequences":    # later phases need this step's batch
                step.call(phase)

    lines = [f"=== {profile} / {name} / {variant[0]}: {w.rows} rows ({dims['batch']} prompts x n={spec['n']}), "
             f"{dims['prompt']}+{dims['response']} tokens, prompt tokens {args.prompt_tokens}, on {row['device']}"]
    for phase in wanted:              # on the timed pass's batch
        part = "the whole phase"
        if phase == "generate_sequences" and 0 < args.profile_decode_steps < dims["response"]:
            step.decode_steps = args.profile_decode_steps
            step.call(phase)                   # its decode graph captured outside the profile
            part = f"prefill + {step.decode_steps} of {dims['response']} decode steps, {w.rows} rows"
        elif phase != "generate_sequences" and w.mini_rows < w.rows:
            step.rows = w.mini_rows
            part = f"one mini-batch ({w.mini_rows} of {w.rows} rows" + (
                ": one optimizer step)" if phase.startswith("update") else ")")
        summary, table = profile_phase(lambda: step.call(phase), device,
                                       work / f"{profile}_{name}_{variant[0]}_{phase}.json.gz")
        step.rows = step.decode_steps = None
        entry = row["phases"].setdefault(phase, {})
        entry.update(wall_s=round(statistics.median(runs[phase]), 4), wall_s_runs=[round(t, 4) for t in runs[phase]],
                     first_s=round(first[phase], 4), profiled=dict(summary, what=part))
        if phase == "generate_sequences":   # the rollout engine's speed: new tokens per second of the whole phase
            tokens = int(step.batch.batch["response_mask"].sum())   # of the last timed pass
            entry.update(tokens_per_s=round(tokens / entry["wall_s"], 1), response_tokens_mean=round(tokens / w.rows, 1))
        lines += [f"\n--- {phase}: wall {entry['wall_s']:.3f} s (median of {len(runs[phase])}); profiled {part}: "
                  f"wall {summary['wall_s']:.3f} s", table, format_summary(summary)]
    return row, "\n".join(lines)


def format_summary(s: dict) -> str:
    total = sum(s["families_s"].values()) or 1.0
    fams = ", ".join(f"{k} {v:.3f} s ({100 * v / total:.0f}%)" for k, v in s["families_s"].items())
    idle = s["device_idle_fraction"]
    return (f"families: {fams}\nbusy {s['device_busy_s']:.3f} s of {s['wall_s']:.3f} s wall; idle "
            f"{'-' if idle is None else f'{100 * idle:.0f}%'}; {s['kernels']} kernels (mean {s['mean_kernel_us']} us); "
            f"{s['host_syncs']} host syncs ({s['host_sync_s']:.3f} s); {s['host_ops']} aten ops dispatched")


def overview(rows: list[dict]) -> str:
    """One line per (profile, setting, phase): wall, busy, idle, the two largest families."""
    head = (f"{'profile':8s} {'setting':10s} {'variant':10s} {'phase':22s} {'first s':>7s} {'wall s':>7s} {'prof s':>7s} "
            f"{'busy s':>7s} {'idle':>5s}  top families")
    lines = [head, "-" * len(head)]
    for row in rows:
        for phase, e in row["phases"].items():
            if not (p := e.get("profiled")):
                continue
            fams = sorted(p["families_s"].items(), key=lambda kv: -kv[1])[:2]
            idle = "-" if p["device_idle_fraction"] is None else f"{100 * p['device_idle_fraction']:.0f}%"
            mfu = "".join(f"  {k}={v:.3f}" for k, v in e.items() if k.startswith("perf/mfu") or k == "tokens_per_s")
            lines.append(f"{row['profile']:8s} {row['setting']:10s} {row.get('variant', ''):10s} {phase:22s} "
                         f"{e.get('first_s', float('nan')):7.2f} {e['wall_s']:7.3f} {p['wall_s']:7.3f} "
                         f"{p['device_busy_s']:7.3f} {idle:>5s}  " + ", ".join(f"{k} {v:.3f}" for k, v in fams) + mfu)
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = harness.parser(__doc__, "profile_out")
    harness.worker_options(ap, "h200", "quickstart,grpo", SETTINGS, tiny="the tiny test model and shapes (CPU runs)")
    ap.add_argument("--phases", default="", help=f"comma-separated subset of {', '.join(PHASES)} (default: all)")
    ap.add_argument("--steps", type=int, default=1, help="timed passes per phase (median reported)")
    ap.add_argument("--profile-decode-steps", type=int, default=32,
                    help="new tokens of the profiled generate (0: the whole response length)")
    ap.add_argument("--prompt-tokens", default="48:128", help="LO:HI real prompt tokens per row, or 'full'")
    ap.add_argument("--eos-share", type=float, default=0.0,
                    help="responses end at any of this share of the token ids (0: every response runs to full length)")
    ap.add_argument("--variant", action="append", type=parse_variant, metavar="NAME=KEY=VALUE[,KEY=VALUE]",
                    help="every case once per variant with these overrides (NAME= is the plan as it is)")
    args = ap.parse_args(argv)
    import torch

    out = Path(args.out)
    (out / "traces").mkdir(parents=True, exist_ok=True)
    rows, reports = [], []
    with tempfile.TemporaryDirectory(prefix="profile_step_") as tmp:
        model = harness.tiny_model(str(Path(tmp) / "tiny")) if args.tiny else args.model
        for profile in args.profiles.split(","):
            for name in args.settings.split(","):
                for variant in args.variant or [("base", [])]:
                    try:
                        row, report = run_setting(profile, name, model, args, out / "traces", variant)
                    except Exception as exc:  # noqa: BLE001 - one failed case must not lose the others' results
                        row = dict(profile=profile, setting=name, variant=variant[0], error=repr(exc), phases={})
                        report = f"=== {profile} / {name} / {variant[0]}: FAILED\n{traceback.format_exc()}"
                    rows.append(row)
                    reports.append(report)
                    print(report, flush=True)
                    gc.collect()                # free this case's workers (reference cycles) before the next is built
                    torch.cuda.empty_cache()    # a no-op where CUDA never started
                    # results written as each case ends: a run stopped at its time limit keeps them
                    (out / "profile_step.txt").write_text(overview(rows) + "\n\n" + "\n\n".join(reports))
                    (out / "profile_step.json").write_text(json.dumps({"cases": rows}, indent=1))
    print("\n" + overview(rows))
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
