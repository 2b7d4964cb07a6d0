"""The device matrix: the stock `main_ppo` under each simulated device profile, PPO and GRPO, on the
Qwen2.5-0.5B shape: exit, s/step, predicted (the doctor's `--json` plan) vs measured peak memory, per step and
per phase (perf/max_memory_allocated_gb never resets: steps before the first validation give the training peak).
Cells run in parallel while their memory caps fit `--budget-gb`.

    python benchmarks/gpu_matrix.py --profiles p40,t4,a100-40gb,h200 --out DIR
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402
from harness import ARR, ROOT, env as _env  # noqa: E402

PROFILES = "p40,p100,v100-16gb,t4,rtx3090,a100-40gb,h200"
ALGOS = {
    "ppo": ["algorithm.adv_estimator=gae", "critic.ppo_micro_batch_size_per_gpu=4"],
    "grpo": ["algorithm.adv_estimator=grpo", f"{ARR}.actor.use_kl_loss=True", f"{ARR}.actor.kl_loss_coef=0.001",
             f"{ARR}.actor.kl_loss_type=low_var_kl", f"{ARR}.rollout.n=2"],
}


def overrides(args, profile: str, algo: str, model: str) -> list[str]:
    """The stock command's overrides for one cell (every hardware key left to the planner)."""
    assets = Path(args.assets)
    return [
        f"data.train_files={assets / 'gsm8k' / 'train.parquet'}", f"data.val_files={assets / 'gsm8k' / 'test.parquet'}",
        f"data.train_batch_size={args.batch}", f"data.max_prompt_length={args.prompt}",
        f"data.max_response_length={args.response}", "data.filter_overlong_prompts=True",
        f"data.val_max_samples={args.val}", f"data.val_batch_size={args.val}",
        f"{ARR}.model.path={model}", f"critic.model.path={model}",
        f"{ARR}.actor.optim.lr=1e-6", "critic.optim.lr=1e-5",
        f"{ARR}.actor.ppo_mini_batch_size={args.batch}", f"{ARR}.actor.ppo_micro_batch_size_per_gpu=4",
        f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu=8", f"{ARR}.ref.log_prob_micro_batch_size_per_gpu=8",
        "trainer.logger=[console,file]", "trainer.val_before_train=False", f"trainer.test_freq={args.test_freq}",
        f"trainer.total_training_steps={args.steps}", "trainer.n_gpus_per_node=1", "trainer.nnodes=1",
        "trainer.save_freq=-1", "trainer.resume_mode=disable",
        f"trainer.experiment_name={profile}_{algo}", f"compat.device={profile}", *ALGOS[algo],
    ]


def predicted(args, profile: str, algo: str, model: str) -> dict:
    """The doctor's plan for the cell: training peak (largest non-validation phase), validation phase."""
    cmd = [sys.executable, "-m", "verl.compat", "--json", *overrides(args, profile, algo, model)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, env=_env(), timeout=300)
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["doctor failed"])[-1]}
    plan = json.loads(proc.stdout)
    totals = {k: v["total_gb"] for k, v in plan["memory"]["phases_total"].items()}
    return {"phases_gb": totals, "train_gb": max(v for k, v in totals.items() if k != "validation"),
            "validation_gb": totals.get("validation"), "peak_gb": plan["predicted_peak_gb"],
            "required_gb": plan["memory"]["required_gb"], "limit_gb": plan["memory_limit_gb"],
            "rollout_chunk": plan["rollout"]["micro_batch_size"], "simulated": plan["device"]["simulated"]}


def measured(jsonl: Path, test_freq: int) -> dict:
    """s/step and the allocator peaks from the run's JSON lines."""
    s = harness.summarize(jsonl)
    by_step = [v for v in s["max_allocated_gb_by_step"]]
    before = [v for v in by_step[:test_freq] if isinstance(v, (int, float))]
    after = [v for v in by_step[test_freq:] if isinstance(v, (int, float))]
    return {"steps": s["steps"], "s_per_step": s["s_per_step"], "first_step_s": s["first_step_s"],
            "train_gb": max(before, default=None), "with_validation_gb": max(after, default=None),
            "run_peak_gb": max(before + after, default=None), "phases_gb": s["phase_peak_gb"],
            "timing_s": s["timing_s"]}


# the workers' phase names (perf/max_memory_allocated_gb/<name>, as timing_s/<name>) -> the plan's phases
PHASES = {"gen": "rollout", "validation": "validation", "old_log_prob": "log_prob", "ref": "ref",
          "values": "values", "update_critic": "critic_update", "update_actor": "actor_update"}


class MemoryBudget:
    """Start a cell only while the GPU memory its cap (or its plan's need, uncapped) reserves is free."""

    def __init__(self, total_gb: float):
        self.total = self.free = total_gb
        self.cond = threading.Condition()

    def take(self, gb: float) -> None:
        with self.cond:
            self.cond.wait_for(lambda: self.free >= gb or self.free == self.total)
            self.free -= gb

    def give(self, gb: float) -> None:
        with self.cond:
            self.free += gb
            self.cond.notify_all()


def run_cell(args, cell: tuple[str, str], model: str, plan: dict, budget: MemoryBudget) -> dict:
    profile, algo = cell
    name = f"{profile}_{algo}"
    out = Path(args.out)
    jsonl, log = out / f"{name}.jsonl", out / f"{name}.log"
    # a simulated profile caps itself at its size; uncapped (the real device), its plan's need + 4 GiB
    need = plan.get("limit_gb") if plan.get("simulated") else (plan.get("required_gb") or args.budget_gb) + 4
    need = min(need or args.budget_gb, args.budget_gb)
    budget.take(need)
    start = time.time()
    try:   # each run starts its own Ray instance: a private temp dir keeps parallel ones apart
        rc = harness.launch_main_ppo(overrides(args, profile, algo, model), jsonl, log, args.cell_timeout,
                                     RAY_TMPDIR=f"/tmp/ray_{name}")["exit"]
    finally:
        budget.give(need)
    row = {"profile": profile, "algo": algo, "exit": rc, "wall_s": round(time.time() - start, 1), "predicted": plan}
    if jsonl.exists():
        try:
            row["measured"] = measured(jsonl, args.test_freq)
        except SystemExit as exc:      # no step logged
            row["measured_error"] = str(exc)
    if rc != 0:
        row["error"] = _last_error(log)
    print(f"{name}: exit {rc} in {row['wall_s']} s", flush=True)
    return row


def _last_error(log: Path) -> str:
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    errors = [ln for ln in lines if "Error" in ln or "error:" in ln]
    return (errors or lines or ["(empty log)"])[-1][:300]


def _pct(pred, meas) -> str:
    return f"{100 * (pred - meas) / meas:+.1f}%" if isinstance(pred, (int, float)) and meas else "-"


def table(rows: list[dict]) -> str:
    """Markdown: one row per cell; GiB; diff = (predicted - measured) / measured."""
    head = ("| profile | algo | exit | s/step | train peak pred / meas (GiB) | diff | validation pred / meas incl. "
            "(GiB) | diff | rollout chunk | note |")
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        p, m = r["predicted"], r.get("measured") or {}
        f = lambda v: f"{v:.2f}" if isinstance(v, (int, float)) else "-"  # noqa: E731
        note = r.get("error") or p.get("error") or r.get("measured_error") or ""
        lines.append(f"| {r['profile']} | {r['algo']} | {r['exit']} | {f(m.get('s_per_step'))} | "
                     f"{f(p.get('train_gb'))} / {f(m.get('train_gb'))} | {_pct(p.get('train_gb'), m.get('train_gb'))} | "
                     f"{f(p.get('validation_gb'))} / {f(m.get('with_validation_gb'))} | "
                     f"{_pct(max(p.get('validation_gb') or 0, p.get('train_gb') or 0), m.get('with_validation_gb'))} | "
                     f"{p.get('rollout_chunk', '-')} | {note.replace('|', '/')} |")
    return "\n".join(lines)


def phase_table(rows: list[dict]) -> str:
    """Markdown: predicted / measured GiB for every phase the plan sizes, each worker call measured alone."""
    lines = ["| profile | algo | " + " | ".join(PHASES) + " |", "|" + "---|" * (2 + len(PHASES))]
    for r in rows:
        pred = r["predicted"].get("phases_gb") or {}
        meas = (r.get("measured") or {}).get("phases_gb") or {}
        cells = []
        for name, plan_name in PHASES.items():
            p, m = pred.get(plan_name), meas.get(name)
            cells.append("-" if p is None and m is None else
                         f"{p if p is not None else '-'} / {round(m, 2) if m is not None else '-'} ({_pct(p, m)})")
        lines.append(f"| {r['profile']} | {r['algo']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--assets", default=harness.ASSETS, help="tok/ (Qwen tokenizer) and gsm8k/ (parquet files)")
    ap.add_argument("--out", default="matrix_out")
    ap.add_argument("--model", default=harness.MODEL, help="built by harness.py when missing")
    ap.add_argument("--profiles", default=PROFILES)
    ap.add_argument("--algos", default="ppo,grpo")
    for name, default in (("batch", 8), ("prompt", 256), ("response", 128), ("val", 256), ("steps", 4),
                          ("test-freq", 2), ("jobs", 6), ("cell-timeout", 420)):   # --val: validation prompts
        ap.add_argument(f"--{name}", type=int, default=default)
    ap.add_argument("--budget-gb", type=float, default=128, help="GPU memory the parallel cells may reserve")
    args = ap.parse_args(argv)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    harness.ensure_model(args.model, args.assets)
    cells = [(p, a) for p in args.profiles.split(",") for a in args.algos.split(",")]
    start = time.time()
    with ThreadPoolExecutor(max_workers=4) as pool:
        plans = list(pool.map(lambda c: predicted(args, *c, args.model), cells))
    budget = MemoryBudget(args.budget_gb)
    # largest reservations first, so the small ones fill the gaps
    order = sorted(range(len(cells)), key=lambda i: -(plans[i].get("limit_gb") or 0))
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = {i: pool.submit(run_cell, args, cells[i], args.model, plans[i], budget) for i in order}
        rows = [futures[i].result() for i in range(len(cells))]
    text = table(rows) + "\n\nPer phase, predicted / measured GiB (diff):\n\n" + phase_table(rows)
    print(text)
    (Path(args.out) / "gpu_matrix.md").write_text(text + "\n")
    (Path(args.out) / "gpu_matrix.json").write_text(json.dumps(
        {"seconds": round(time.time() - start, 1), "settings": vars(args), "cells": rows}, indent=1))
    return 0 if all(r["exit"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
