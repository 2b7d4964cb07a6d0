"""The stock `main_ppo` per cell `profile:shape:mode[:algo]` under a simulated device profile (random-weight
Qwen2.5 shapes 0.5b-7b): the doctor's predicted peak per phase (`python -m verl.compat --json`) beside the run's.

Modes: full (the plan picks dtype, offload, checkpointing, micro-batches), lora (rank 32), qlora (4-bit base),
full8bit (8-bit AdamW states); algos: grpo (default, KL loss), ppo (GAE + critic). 8 prompts of 256 tokens; `--settings
scale`: x 4 x 256 full-length new tokens, one validation on 32 prompts at the end; `matrix` (the device matrix):
x 2 (GRPO) x 128, validations on 256 prompts every 2 steps. Writes matrix.json and prints one table.

    python benchmarks/matrix.py --cells goals --jobs 3 --out DIR          # the model-scale goals, 3 at a time
    python benchmarks/matrix.py --cells devices --settings matrix --plan-only     # every profile x PPO/GRPO, on CPU
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402
from harness import ARR, ROOT  # noqa: E402

PROFILES = ("p40", "p100", "v100-16gb", "t4", "rtx3090", "a100-40gb", "h200")
SHAPES = ("0.5b", "1.5b", "3b", "7b")
GOALS = ("p40:1.5b:full", "p40:3b:full", "p40:7b:lora", "t4:1.5b:full", "t4:7b:qlora",
         "rtx3090:3b:full", "rtx3090:7b:lora", "a100-40gb:7b:full")
devices = lambda profiles: ",".join(f"{p}:0.5b:full:{a}" for p in profiles for a in ("ppo", "grpo"))  # noqa: E731
NAMED = {"goals": ",".join(GOALS), "devices": devices(PROFILES)}   # the device matrix: every profile, PPO and GRPO
LORA = [f"{ARR}.model.lora_rank=32", f"{ARR}.model.lora_alpha=32"]
MODES = {"full": [], "lora": LORA, "qlora": [*LORA, f"{ARR}.model.load_in_4bit=true"],
         "full8bit": [f"{ARR}.actor.optim.optimizer_impl=bitsandbytes.optim", f"{ARR}.actor.optim.optimizer=AdamW8bit"]}
ALGOS = {"ppo": ["algorithm.adv_estimator=gae", "critic.ppo_micro_batch_size_per_gpu=4"], "grpo": harness.GRPO_ALGO}
# GRPO samples per prompt, response tokens, validation prompts, steps between validations (None: the last step)
SETTINGS = {"scale": dict(n=4, response=256, val=32, test_freq=None, extra=[f"{ARR}.rollout.ignore_eos=True"]),
            "matrix": dict(n=2, response=128, val=256, test_freq=2, extra=[])}
# measured phase (perf/max_memory_allocated_gb/<name>) -> the memory model's phase
PHASES = {"gen": "rollout", "old_log_prob": "log_prob", "ref": "ref", "values": "values",
          "update_critic": "critic_update", "update_actor": "actor_update", "validation": "validation"}


def parse_cells(text: str) -> list[tuple[str, str, str, str]]:
    """Comma-separated `profile:shape:mode[:algo]`, `goals` or `devices` -> (profile, shape, mode, algo)."""
    cells = []
    for name in [c for item in text.split(",") for c in NAMED.get(item, item).split(",") if c]:
        parts = name.split(":")
        if len(parts) == 3:
            parts.append("grpo")
        if len(parts) != 4 or parts[1] not in SHAPES or parts[2] not in MODES or parts[3] not in ALGOS:
            raise SystemExit(f"--cells: '{name}' is not profile:shape:mode[:algo] (shapes {', '.join(SHAPES)}; "
                             f"modes {', '.join(MODES)}; algos {', '.join(ALGOS)}), 'goals' or 'devices'")
        cells.append(tuple(parts))
    return cells


def overrides(cell, settings: str, assets: Path, model: Path, steps: int, full_length: bool) -> list[str]:
    """The stock command's overrides for a cell (every hardware key left to the planner). `full_length`: every
    prompt at its 256-token limit (questions repeated, cut on the left), the length the plan assumes."""
    profile, _, mode, algo = cell
    s, name = SETTINGS[settings], "_".join(cell)
    data = f"{assets}/gsm8k_long" if full_length else f"{assets}/gsm8k"
    return [f"data.train_files={data}/train.parquet", f"data.val_files={data}/test.parquet",
            "data.train_batch_size=8", "data.max_prompt_length=256", f"data.max_response_length={s['response']}",
            "data.truncation=left" if full_length else "data.filter_overlong_prompts=True",
            f"data.val_max_samples={s['val']}", f"data.val_batch_size={s['val']}",
            f"{ARR}.model.path={model}", f"critic.model.path={model}", f"{ARR}.actor.optim.lr=1e-6",
            "critic.optim.lr=1e-5", f"{ARR}.actor.ppo_mini_batch_size=8", f"{ARR}.actor.ppo_micro_batch_size_per_gpu=4",
            f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu=8", f"{ARR}.ref.log_prob_micro_batch_size_per_gpu=8",
            "trainer.logger=[console,file]", "trainer.val_before_train=False", f"trainer.total_training_steps={steps}",
            f"trainer.test_freq={s['test_freq'] or steps}", "trainer.n_gpus_per_node=1", "trainer.nnodes=1",
            "trainer.save_freq=-1", "trainer.resume_mode=disable", f"trainer.experiment_name={name}",
            f"trainer.default_local_dir=/tmp/ckpt_{name}", f"compat.device={profile}", *s["extra"], *ALGOS[algo],
            *([f"{ARR}.rollout.n={s['n']}"] if algo == "grpo" else []), *MODES[mode]]


def predicted(cell_overrides: list[str], shape: str) -> dict:
    """The doctor's answer for a cell (`python -m verl.compat --json`; a process per plan, as each composes its own
    Hydra config): refused with the planner's reason, or the predicted peak per phase and the actor's settings."""
    proc = subprocess.run([sys.executable, "-m", "verl.compat", "--json", f"--model-spec=qwen2.5-{shape}",
                           *cell_overrides], capture_output=True, text=True, cwd=ROOT, env=harness.env(), timeout=300)
    if proc.returncode != 0:
        return {"refused": proc.stderr.split("no plan for this config:")[-1].strip()[-800:]}
    plan = json.loads(proc.stdout)
    m, a = plan["memory"], plan["actor"]
    return {"phases": {k: v["total_gb"] for k, v in m["phases_total"].items()}, "terms": m["phases"],
            "peak_gb": plan["predicted_peak_gb"], "required_gb": m["required_gb"], "limit_gb": plan["memory_limit_gb"],
            "host_gb": m.get("host_gb_per_worker"),   # offloaded plans: one worker's host memory
            "simulated": plan["device"]["simulated"], "rollout_chunk": plan["rollout"]["micro_batch_size"],
            "actor": {k: a.get(k) for k in ("compute_dtype", "param_offload", "optimizer_offload",
                                            "gradient_checkpointing", "micro_batch_size_per_gpu", "lora_rank")}}


def measured(jsonl: Path, test_freq: int) -> dict:
    """The run's summary (harness.summarize: s/step, the peak per phase, ...), its peak over the run, and its peak
    before the first validation (the allocator's peak never resets: later steps carry the validation's)."""
    s = harness.summarize(jsonl)
    by_step = [v if isinstance(v, (int, float)) else 0 for v in s["max_allocated_gb_by_step"]]
    return {**s, "update_actor_s": s["timing_s"]["update_actor"], "peaks": s["phase_peak_gb"],
            "train_gb": max(by_step[:test_freq], default=0) or None, "run_peak_gb": max(by_step, default=0) or None}


def judge(pred: dict, meas: dict) -> dict:
    """Per phase on both sides: predicted / measured, and whether it is right (within +-15%, under by <= 3%)."""
    out = {}
    for phase, model_phase in PHASES.items():
        m, p = meas.get("peaks", {}).get(phase), pred.get("phases", {}).get(model_phase)
        if m and p:
            out[phase] = {"predicted": p, "measured": m, "ratio": round(p / m, 3), "ok": 0.97 <= p / m <= 1.15}
    return out


class MemoryBudget:
    """Start a cell only while the GPU memory it reserves is free (one too large for the budget runs alone)."""

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


def run_cell(cell, cell_overrides: list[str], plan: dict, args, budget: MemoryBudget) -> dict:
    """The cell's run under its reservation: a simulated profile caps itself at its size; uncapped, its plan's
    need + 4 GiB."""
    row, name, out = {"cell": ":".join(cell), "plan": plan}, "_".join(cell), Path(args.out)
    if args.plan_only or "refused" in plan:
        return row
    need = min(plan["limit_gb"] if plan["simulated"] else plan["required_gb"] + 4, args.budget_gb)
    budget.take(need)
    try:   # each run starts its own Ray instance: a private temp dir keeps parallel ones apart
        run = harness.launch_main_ppo(cell_overrides, out / f"{name}.jsonl", out / f"{name}.log", args.timeout,
                                      RAY_TMPDIR=f"/tmp/ray_{name}")
    finally:
        budget.give(need)
    row["run"] = run
    try:
        run.update(measured(out / f"{name}.jsonl", SETTINGS[args.settings]["test_freq"] or args.steps))
    except (SystemExit, FileNotFoundError) as exc:      # no step logged
        run["error"] = str(exc)
    if run["exit"] != 0:
        lines = [ln.strip() for ln in (out / f"{name}.log").read_text(errors="replace").splitlines() if ln.strip()]
        run["error"] = ([ln for ln in lines if "Error" in ln or "error:" in ln] or lines or ["(empty log)"])[-1][:300]
    row["phases"] = judge(plan, run)
    print(f"{row['cell']}: exit {run['exit']} in {run['wall_s']} s", flush=True)
    return row


def table(rows: list[dict]) -> str:
    """Markdown, one line per cell; GiB; a phase off the rule is marked `off`."""
    lines = ["| cell | plan | exit | s/step | update_actor s | run peak pred / meas | phase pred / meas (diff) |",
             "|---|---|---|---|---|---|---|"]
    f = lambda v: f"{v:.2f}" if isinstance(v, (int, float)) else "-"  # noqa: E731
    for r in rows:
        plan, run = r["plan"], r.get("run", {})
        if "refused" in plan:
            lines.append(f"| {r['cell']} | refused: {plan['refused'][:90]} | | | | | |")
            continue
        a = plan.get("actor", {})
        what = (f"{a.get('compute_dtype')}, offload {a.get('param_offload')}/{a.get('optimizer_offload')}, "
                f"chunk {plan.get('rollout_chunk')}, limit {f(plan.get('limit_gb'))}")
        phases = ", ".join(f"{k} {v['predicted']:.2f}/{v['measured']:.2f} ({100 * (v['ratio'] - 1):+.1f}%"
                           f"{'' if v['ok'] else ', off'})" for k, v in r.get("phases", {}).items())
        note = f" {run['error']}".replace("|", "/") if run.get("error") else ""
        if plan.get("host_gb"):   # the worker's peak resident memory against the host-memory model
            note += f"; host {f(plan['host_gb'])} / {f(run.get('memory_gb', {}).get('perf/cpu_memory_used_gb'))}"
        lines.append(f"| {r['cell']} | {what} | {run.get('exit', '')} | {f(run.get('s_per_step'))} | "
                     f"{f(run.get('update_actor_s'))} | {f(plan.get('peak_gb'))} / {f(run.get('run_peak_gb'))} | "
                     f"{phases}{note} |")
    judged = [v for r in rows for v in r.get("phases", {}).values()]
    if judged:
        lines.append(f"\n{sum(v['ok'] for v in judged)} of {len(judged)} phases within +15% / -3%")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = harness.parser(__doc__, os.environ.get("OUT", "matrix_out"))
    ap.add_argument("--cells", default="goals", help="'goals', 'devices' or profile:shape:mode[:algo],...")
    ap.add_argument("--settings", default="scale", choices=SETTINGS, help="the runs' shape (module docstring)")
    ap.add_argument("--assets", default=harness.ASSETS, help="holds tok/ and gsm8k/ (jsonl or parquet files)")
    ap.add_argument("--models", default="/tmp/qwen-shapes", help="the shapes' models, built when missing")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=1, help="cells run at once, while their memory fits --budget-gb")
    ap.add_argument("--budget-gb", type=float, default=128, help="GPU memory the parallel cells may reserve")
    ap.add_argument("--timeout", type=float, default=420, help="seconds per run")
    ap.add_argument("--full-length", action="store_true",
                    help="every prompt at its 256-token limit (the plan's worst case) instead of GSM8K's own lengths")
    ap.add_argument("--plan-only", action="store_true", help="only the planner's answers (no model, no GPU)")
    args = ap.parse_args(argv)
    cells, assets, models = parse_cells(args.cells), ROOT / args.assets, Path(args.models)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    if not args.plan_only:
        harness.prepare_assets(assets)
        for shape in sorted({c[1] for c in cells}):   # one at a time, drawn on the GPU if any, saved in half size
            harness.ensure_model(str(models / f"qwen2.5-{shape}"), str(assets), shape_name=f"qwen2.5-{shape}",
                                 save_dtype="bfloat16", init_device=None)
    start = time.time()
    cmds = [overrides(c, args.settings, assets, models / f"qwen2.5-{c[1]}", args.steps, args.full_length) for c in cells]
    with ThreadPoolExecutor(4) as pool:
        plans = list(pool.map(lambda i: predicted(cmds[i], cells[i][1]), range(len(cells))))
    budget = MemoryBudget(args.budget_gb)
    order = sorted(range(len(cells)), key=lambda i: -(plans[i].get("limit_gb") or 0))   # largest first
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        futures = {i: pool.submit(run_cell, cells[i], cmds[i], plans[i], args, budget) for i in order}
        rows = [futures[i].result() for i in range(len(cells))]
    (Path(args.out) / "matrix.json").write_text(json.dumps(
        {"seconds": round(time.time() - start, 1), "settings": vars(args), "cells": rows}, indent=1))
    print(table(rows))
    return 0 if all(r.get("run", {}).get("exit", 0) == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
