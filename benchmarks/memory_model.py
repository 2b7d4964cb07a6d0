"""Memory model vs the real workers: each phase's peak allocated memory, predicted and measured.

Per (profile, setting, algorithm), in a process of its own: one unmeasured update (AdamW's states), then every
phase and a validation generate. Measured: `torch.cuda.max_memory_allocated`; on CPU, `LiveBytes`. Writes
memory_model.json and prints calibration hints.

    python benchmarks/memory_model.py --profiles p40,t4,h200 --settings matrix --val-rows 256 --jobs 3 --out DIR
    python benchmarks/memory_model.py --tiny --profiles cpu --settings tiny --in-process --out /tmp/mm   # CPU
"""
from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import tempfile
import time
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402
from harness import ARR, SHAPES  # noqa: E402
from worker_harness import StepPhases, build_workers, stock_overrides, synthetic_step_batch  # noqa: E402

GiB = 1024 ** 3
SETTINGS = {k: SHAPES[k] for k in ("field_report", "quickstart", "matrix", "qwen_cpu", "tiny")}
ALGOS = {"ppo": ["algorithm.adv_estimator=gae"],                                    # GAE + critic
         "grpo": ["algorithm.adv_estimator=grpo", f"{ARR}.actor.use_kl_loss=True", f"{ARR}.rollout.n=2"]}
PHASES = ("rollout", "log_prob", "ref", "values", "critic_update", "actor_update", "validation")


def _local(t):
    """A DTensor's local shard (the storage it owns on this rank), else the tensor itself."""
    return t._local_tensor if hasattr(t, "_local_tensor") else t


def _storage_key(t) -> tuple[int, int] | None:
    """(storage pointer, bytes); None for what holds no storage of its own to count: meta tensors, and
    sparse ones (a tied embedding's sparse gradient: a few rows, and the dense sum it feeds is counted)."""
    t = _local(t)
    if t.device.type == "meta" or t.is_sparse:
        return None
    s = t.untyped_storage()
    return (s.data_ptr(), s.nbytes()) if s.nbytes() else None


def resident_storages(*objects) -> dict[int, int]:
    """{storage pointer: bytes} of the distinct storages held by modules (weights, grads, buffers)
    and optimizers (their states)."""
    import torch

    seen = {}
    for obj in objects:
        if isinstance(obj, torch.nn.Module):
            tensors = [*obj.parameters(), *(p.grad for p in obj.parameters() if p.grad is not None), *obj.buffers()]
        else:
            tensors = [v for st in obj.state.values() for v in st.values() if isinstance(v, torch.Tensor)]
        seen.update(key for t in tensors if (key := _storage_key(t)) is not None)
    return seen


def _live_bytes_mode(resident: set[int]):
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves
    import torch

    class LiveBytes(TorchDispatchMode):
        """Peak bytes of the tensor storages created while active (the CPU stand-in for the CUDA
        allocator's peak): each new storage counts once, from creation until it is freed."""

        def __init__(self):
            super().__init__()
            self.live = self.peak = 0
            self._sizes: dict[int, int] = {}

        def _free(self, ptr: int) -> None:
            self.live -= self._sizes.pop(ptr, 0)

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor) and (key := _storage_key(t)) is not None:
                    ptr, size = key
                    if ptr not in self._sizes and ptr not in resident:
                        self._sizes[ptr] = size
                        self.live += size
                        self.peak = max(self.peak, self.live)
                        weakref.finalize(_local(t).untyped_storage(), self._free, ptr)
            return out

    return LiveBytes()


def measure(fn, device, resident=()) -> tuple[float, float]:
    """(GiB allocated when `fn` starts, peak GiB while it runs): the allocator's figures on CUDA; on CPU
    the workers' modules and optimizers (`resident`) plus the peak of what the phase allocates."""
    import torch

    if device.type == "cuda":
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        start = torch.cuda.memory_allocated()
        fn()
        torch.cuda.synchronize()
        return start / GiB, torch.cuda.max_memory_allocated() / GiB
    gc.collect()
    before = resident_storages(*resident)
    tracker = _live_bytes_mode(set(before))
    gc.disable()        # cyclic garbage is freed at the end, not whenever a collection happens: repeatable
    try:
        with tracker:
            fn()
    finally:
        gc.enable()
    start = sum(before.values())
    return start / GiB, (start + tracker.peak) / GiB


def run_case(profile: str, setting_name: str, algo: str, model: str, val_rows: int | None = None,
             extra: tuple[str, ...] = ()) -> dict:
    """Plan one case (`extra`: more Hydra overrides), build the real workers, run every phase once;
    predicted and measured GiB."""
    import torch

    setting = SETTINGS[setting_name]
    w = build_workers(stock_overrides(setting, profile, model, val_rows) + ALGOS[algo] + list(extra))
    plan = w.plan
    # phase totals from the terms (kept to 0.1 MiB; the rounded totals would swamp a tiny model's phases)
    predicted = {k: round(sum(t.values()), 4) for k, t in plan.memory.get("phases", {}).items()}
    result = {"profile": profile, "setting": setting_name, "algo": algo, "predicted": predicted, "measured": {},
              "errors": {}, "predicted_peak_gb": plan.predicted_peak_gb, "memory_limit_gb": plan.memory_limit_gb,
              "terms": plan.memory.get("phases", {}), "rollout_micro_batch_size": plan.rollout.micro_batch_size,
              "device": torch.cuda.get_device_name(w.device) if w.device.type == "cuda" else "cpu"}

    # warm-up: one update of each trained role, so the optimizer states exist (step 2 onwards)
    warm = synthetic_step_batch(w.rows, setting["prompt"], setting["response"], w.vocab)
    if w.critic is not None:
        w.critic.update_critic(warm)
    w.actor.update_actor(warm)
    del warm

    step = StepPhases(w, prompt=setting["prompt"])
    val = val_rows if val_rows is not None else (plan.rollout.micro_batch_size or w.rows)
    result["validation_rows"] = val
    steps = {"rollout": step.generate_sequences, "log_prob": step.compute_log_prob, "ref": step.compute_ref_log_prob,
             "values": step.compute_values, "critic_update": step.update_critic, "actor_update": step.update_actor,
             "validation": lambda: step.validate(val)}
    for phase in PHASES:
        if phase not in predicted:
            continue
        try:
            clock = time.time()
            start, peak = measure(steps[phase], w.device, w.resident())
            result["measured"][phase] = round(peak, 4)
            result.setdefault("at_start", {})[phase] = round(start, 4)
            result.setdefault("seconds", {})[phase] = round(time.time() - clock, 2)
        except torch.OutOfMemoryError as exc:
            result["errors"][phase] = f"OOM: {str(exc).splitlines()[0]}"
            if phase == "rollout":
                break
    return result


def _run_child(argv: list[str], case: tuple[str, str, str], model: str, timeout: float, workdir: Path) -> dict:
    """One case in a process of its own: this command again, narrowed to the case (later options win)."""
    path, start = workdir / ("_".join(case) + ".json"), time.time()
    cmd = [sys.executable, __file__, *argv, "--profiles", case[0], "--settings", case[1], "--algos", case[2],
           "--model", model, "--child", str(path)]
    proc = subprocess.run(cmd, env=harness.env(), capture_output=True, text=True, timeout=timeout)
    row = json.loads(path.read_text()) if proc.returncode == 0 and path.exists() else dict(
        zip(("profile", "setting", "algo"), case), error=f"exit {proc.returncode}",
        log_tail=(proc.stdout + proc.stderr).strip().splitlines()[-12:])
    return {**row, "wall_s": round(time.time() - start, 1)}


def format_table(rows: list[dict]) -> str:
    """One line per (case, phase): predicted, measured, error %; a failed case gets one line with why."""
    head = (f"{'profile':10s} {'setting':12s} {'algo':5s} {'phase':14s} {'predicted':>9s} {'measured':>9s} "
            f"{'diff':>7s} {'transient pred/meas':>19s}   (GiB, max_memory_allocated; transient: above the "
            f"phase's start)")
    lines = [head, "-" * len(head)]
    for row in rows:
        tag = f"{row['profile']:10s} {row['setting']:12s} {row['algo']:5s}"
        if "error" in row:
            lines.append(f"{tag} {'(case failed)':14s} {row['error']}: {' | '.join(row.get('log_tail', [])[-2:])}")
            continue
        for phase in PHASES:
            if phase not in row["predicted"]:
                continue
            pred, meas = row["predicted"][phase], row["measured"].get(phase)
            if meas is None:
                lines.append(f"{tag} {phase:14s} {pred:9.3f} {'-':>9s} {row['errors'].get(phase, 'not run')}")
                continue
            start = row["at_start"][phase]
            lines.append(f"{tag} {phase:14s} {pred:9.3f} {meas:9.3f} {100 * (pred - meas) / meas:+6.1f}% "
                         f"{pred - start:9.3f}/{meas - start:<9.3f}")
    return "\n".join(lines)


def calibration_hints(rows: list[dict], tolerance: float = 0.15) -> list[str]:
    """What to change in verl/compat/planning/memory.py: phases off by more than `tolerance`, with the gap and
    the term that dominates that phase's prediction (the first place to look)."""
    hints = []
    for row in rows:
        for phase, meas in row.get("measured", {}).items():
            pred = row["predicted"][phase]
            if meas <= 0 or abs(pred - meas) <= tolerance * meas:
                continue
            terms = row["terms"].get(phase, {})
            biggest = max((k for k in terms if not k.endswith((".weights", ".optimizer"))), default=None,
                          key=lambda k: terms[k])
            hints.append(f"{row['profile']}/{row['setting']}/{row['algo']} {phase}: predicted {pred:.3f}, measured "
                         f"{meas:.3f} GiB ({meas - pred:+.3f} GiB unexplained, measured at the phase's start "
                         f"{row['at_start'][phase]:.3f}); largest transient term: {biggest} = "
                         f"{terms.get(biggest, 0):.3f} GiB")
    return hints or [f"every measured phase is within ±{tolerance:.0%} of its prediction: nothing to recalibrate"]


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = harness.parser(__doc__, "memory_out")
    harness.worker_options(ap, "p40,t4,a100-40gb,h200", "field_report", SETTINGS)
    ap.add_argument("--algos", default="ppo,grpo", help="ppo (GAE + critic), grpo (use_kl_loss, n=2)")
    ap.add_argument("--val-rows", type=int, help="data.val_batch_size of the validation phase (default: one chunk)")
    ap.add_argument("--jobs", type=int, default=1, help="cases run at once (each caps its own memory)")
    ap.add_argument("--in-process", action="store_true", help="every case in this process (CPU runs and tests)")
    ap.add_argument("--case-timeout", type=float, default=600)
    ap.add_argument("--child", metavar="JSON", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        row = run_case(args.profiles, args.settings, args.algos, args.model, args.val_rows, tuple(args.override))
        Path(args.child).write_text(json.dumps(row, indent=1))
        import torch.distributed as dist

        if dist.is_initialized():     # a group left open can abort the process at exit
            dist.destroy_process_group()
        return 0
    start = time.time()
    with tempfile.TemporaryDirectory(prefix="memory_model_") as tmp:
        model = harness.tiny_model(str(Path(tmp) / "tiny")) if args.tiny else harness.ensure_model(args.model)
        cases = [(p, s, a) for p in args.profiles.split(",") for s in args.settings.split(",")
                 for a in args.algos.split(",")]
        if args.in_process:
            rows = [run_case(*case, model, args.val_rows, tuple(args.override)) for case in cases]
        else:
            with ThreadPoolExecutor(max_workers=max(args.jobs, 1)) as pool:
                rows = list(pool.map(lambda c: _run_child(argv, c, model, args.case_timeout, Path(tmp)), cases))
    hints = calibration_hints(rows)
    print(format_table(rows) + "\n\ncalibration (verl/compat/planning/memory.py):\n" + "\n".join(f"  {h}" for h in hints))
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "memory_model.json").write_text(json.dumps(
        {"seconds": round(time.time() - start, 1), "cases": rows, "calibration": hints}, indent=1))
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
