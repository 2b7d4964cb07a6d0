"""Model scale on one device: the stock `main_ppo` on Qwen2.5 shapes (0.5B-7B, random weights) under a simulated
device profile, in each training mode, with the plan's predicted peak per phase beside the measured one.

A cell is `profile:shape:mode`, e.g. `p40:1.5b:full`, `t4:7b:qlora`; modes: `full` (the plan picks dtype,
offload, checkpointing and micro-batches), `lora` (`lora_rank=32`), `qlora` (LoRA on a 4-bit base), `full8bit`
(AdamW states in 8 bits). Every cell
runs the same GRPO shape (8 prompts x 4 samples x (256+256), KL loss, a validation at the last step).

    python benchmarks/model_scale.py --cells goals --out DIR            # the cells of the model-scale goals
    python benchmarks/model_scale.py --cells p40:7b:lora,t4:1.5b:full --jobs 2 --out DIR
    python benchmarks/model_scale.py --cells goals --plan-only          # the planner's side only (no GPU)

Per cell: the plan (`python -m verl.compat`'s own `plan_for`: refused or not, predicted peak per phase), then the
run (`launch.py`): exit, s/step, update_actor s, measured peak per phase (`perf/max_memory_allocated_gb/*`, the
largest over the steps). A phase counts as right when predicted is within +-15% of measured and never under it
by more than 3%. Models are built once under `--models` (on the GPU when there is one). Writes
`model_scale.json` and prints one table.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import harness  # noqa: E402

ARR = "actor_rollout_ref"
GOALS = ("p40:1.5b:full", "p40:3b:full", "p40:7b:lora", "t4:1.5b:full", "t4:7b:qlora",
         "rtx3090:3b:full", "rtx3090:7b:lora", "a100-40gb:7b:full")
MODES = {
    "full": [],
    "lora": [f"{ARR}.model.lora_rank=32", f"{ARR}.model.lora_alpha=32"],
    "qlora": [f"{ARR}.model.lora_rank=32", f"{ARR}.model.lora_alpha=32", f"{ARR}.model.load_in_4bit=true"],
    "full8bit": [f"{ARR}.actor.optim.optimizer_impl=bitsandbytes.optim", f"{ARR}.actor.optim.optimizer=AdamW8bit"],
}
# measured phase (perf/max_memory_allocated_gb/<name>) -> the memory model's phase
PHASES = {"gen": "rollout", "old_log_prob": "log_prob", "ref": "ref", "update_actor": "actor_update",
          "validation": "validation"}


def grpo_shape(assets: Path, model: Path, steps: int, full_length: bool) -> list[str]:
    """The cells' common overrides: GRPO 8 x 4 x (256+256), KL loss, one validation on 32 prompts at the end.
    `full_length`: every prompt is 256 tokens (questions repeated, cut on the left), the length the plan assumes."""
    data = f"{assets}/gsm8k_long" if full_length else f"{assets}/gsm8k"
    return [f"data.train_files={data}/train.parquet", f"data.val_files={data}/test.parquet",
            "data.train_batch_size=8", "data.max_prompt_length=256", "data.max_response_length=256",
            "data.val_max_samples=32",
            "data.truncation=left" if full_length else "data.filter_overlong_prompts=True",
            f"{ARR}.model.path={model}", "algorithm.adv_estimator=grpo", f"{ARR}.actor.use_kl_loss=True",
            f"{ARR}.actor.kl_loss_coef=0.001", f"{ARR}.rollout.n=4", f"{ARR}.actor.ppo_mini_batch_size=8",
            f"{ARR}.actor.ppo_micro_batch_size_per_gpu=4", f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu=8",
            f"{ARR}.ref.log_prob_micro_batch_size_per_gpu=8",
            f"{ARR}.rollout.ignore_eos=True", f"{ARR}.actor.optim.lr=1e-6", "trainer.logger=[console,file]",
            "trainer.val_before_train=False", "trainer.n_gpus_per_node=1", "trainer.nnodes=1",
            f"trainer.total_training_steps={steps}", f"trainer.test_freq={steps}", "trainer.save_freq=-1",
            "trainer.resume_mode=disable"]


def parse_cells(text: str) -> list[tuple[str, str, str]]:
    names = GOALS if text == "goals" else tuple(c for c in text.split(",") if c)
    cells = []
    for name in names:
        parts = name.split(":")
        if len(parts) != 3 or parts[2] not in MODES:
            raise SystemExit(f"cell '{name}' is not profile:shape:mode (modes: {', '.join(MODES)})")
        cells.append((parts[0], parts[1], parts[2]))
    return cells


def prepare_assets(assets: Path) -> None:
    """GSM8K parquet files from the jsonl files in `assets/gsm8k` (examples/data_preprocess/gsm8k.py)."""
    if not (assets / "gsm8k" / "train.parquet").exists():
        subprocess.run([sys.executable, str(ROOT / "examples/data_preprocess/gsm8k.py"), "--local_dataset_path",
                        str(assets / "gsm8k"), "--local_save_dir", str(assets / "gsm8k")], check=True)
    if not (assets / "gsm8k_long" / "train.parquet").exists():
        import pandas as pd

        (assets / "gsm8k_long").mkdir(exist_ok=True)
        for split in ("train", "test"):
            frame = pd.read_parquet(assets / "gsm8k" / f"{split}.parquet")
            frame["prompt"] = [[{**m, "content": " ".join([m["content"]] * 8)} for m in p] for p in frame["prompt"]]
            frame.to_parquet(assets / "gsm8k_long" / f"{split}.parquet")


def build_model(models: Path, shape: str, tokenizer: Path) -> Path:
    """The shape's random-weight model under `models` (built on the GPU when there is one, saved in half size)."""
    out = models / f"qwen2.5-{shape}"
    if not (out / "config.json").exists():
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
        harness.build_model(str(out), str(tokenizer), shape_name=f"qwen2.5-{shape}", init_device=device,
                            save_dtype="bfloat16")
    return out


def predicted(overrides: list[str], profile: str, shape: str) -> dict:
    """The planner's answer for a cell, in a child process (each plan composes its own Hydra config)."""
    code = ("import json, sys; from verl.compat.__main__ import plan_for\n"
            "try:\n"
            "    _, _, plan = plan_for(sys.argv[3:], device=sys.argv[1], model_spec=sys.argv[2])\n"
            "except Exception as err:\n"
            "    print(json.dumps({'refused': f'{type(err).__name__}: {err}'})); sys.exit(0)\n"
            "terms = plan.memory.get('phases', {})\n"
            "phases = {k: round(sum(t.values()), 3) for k, t in terms.items()}\n"
            "a = plan.actor\n"
            "print(json.dumps({'phases': phases, 'terms': terms, 'peak_gb': plan.predicted_peak_gb, 'limit_gb': plan.memory_limit_gb,"
            " 'actor': {k: getattr(a, k) for k in ('param_dtype', 'compute_dtype', 'param_offload',"
            " 'optimizer_offload', 'gradient_checkpointing', 'micro_batch_size_per_gpu', 'lora_rank', 'frozen_dtype',"
            " 'base_quantization', 'optimizer_8bit') if hasattr(a, k)}}))\n")
    proc = subprocess.run([sys.executable, "-c", code, profile, f"qwen2.5-{shape}", *overrides],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    return json.loads(lines[-1]) if lines else {"refused": f"doctor failed: {proc.stderr[-800:]}"}


def measured(jsonl: Path) -> dict:
    """Peak per phase (largest over the steps), s/step (median after the first), update_actor s."""
    records = [json.loads(line)["data"] for line in jsonl.read_text().splitlines() if line.strip()] \
        if jsonl.exists() else []
    steps = [r for r in records if "timing_s/step" in r]
    peaks = {}
    for phase in PHASES:
        values = [r[f"perf/max_memory_allocated_gb/{phase}"] for r in records
                  if f"perf/max_memory_allocated_gb/{phase}" in r]
        if values:
            peaks[phase] = round(max(values), 3)
    later = steps[1:] or steps
    return {"steps": len(steps), "peaks": peaks,
            "s_per_step": round(statistics.median(r["timing_s/step"] for r in later), 2) if later else None,
            "update_actor_s": round(statistics.median(r.get("timing_s/update_actor", 0.0) for r in later), 2)
            if later else None}


def judge(pred: dict, meas: dict) -> dict:
    """Per phase: predicted / measured, and whether it is within the tolerance (+-15%, under by <= 3%)."""
    out = {}
    for phase, model_phase in PHASES.items():
        m, p = meas.get("peaks", {}).get(phase), pred.get("phases", {}).get(model_phase)
        if m and p:
            ratio = p / m
            out[phase] = {"predicted": p, "measured": m, "ratio": round(ratio, 3), "ok": 0.97 <= ratio <= 1.15}
    return out


def run_cell(cell, args, assets: Path) -> dict:
    profile, shape, mode = cell
    name = f"{profile}_{shape}_{mode}"
    model = build_model(Path(args.models), shape, assets / "tok") if not args.plan_only \
        else Path(args.models) / f"qwen2.5-{shape}"
    overrides = grpo_shape(assets, model, args.steps, args.full_length) + MODES[mode] + [f"compat.device={profile}",
                                                                       f"trainer.default_local_dir=/tmp/ckpt_{name}"]
    overrides += args.override
    row = {"cell": ":".join(cell), "plan": predicted(overrides, profile, shape)}
    if args.plan_only or "refused" in row["plan"]:
        return row
    out = Path(args.out)
    run = harness.launch_main_ppo(overrides, out / f"{name}.jsonl", out / f"{name}.log", args.timeout)
    row["run"] = {**run, **measured(out / f"{name}.jsonl")}
    row["phases"] = judge(row["plan"], row["run"])
    return row


def table(rows: list[dict]) -> str:
    lines = ["| cell | plan | exit | s/step | update_actor s | phase: predicted / measured GB |", "|---|---|---|---|---|---|"]
    for r in rows:
        plan = r["plan"]
        if "refused" in plan:
            lines.append(f"| {r['cell']} | refused: {plan['refused'][:90]} | | | | |")
            continue
        a = plan.get("actor", {})
        what = (f"{a.get('compute_dtype')}, offload {a.get('param_offload')}/{a.get('optimizer_offload')}, "
                f"peak {plan.get('peak_gb')} of {plan.get('limit_gb')}")
        run = r.get("run", {})
        phases = " ".join(f"{k} {v['predicted']}/{v['measured']}{'' if v['ok'] else ' (off)'}"
                          for k, v in r.get("phases", {}).items())
        lines.append(f"| {r['cell']} | {what} | {run.get('exit', '')} | {run.get('s_per_step', '')} | "
                     f"{run.get('update_actor_s', '')} | {phases} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", default="goals", help="'goals' or profile:shape:mode,... (shapes 0.5b 1.5b 3b 7b)")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--assets", default=str(ROOT / ".gpu-assets"), help="holds tok/ and gsm8k/*.jsonl")
    ap.add_argument("--models", default="/tmp/qwen-shapes")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=1, help="cells run at once (each capped by its profile)")
    ap.add_argument("--timeout", type=float, default=420, help="seconds per run")
    ap.add_argument("--full-length", action="store_true",
                    help="every prompt at its 256-token limit (the plan's worst case) instead of GSM8K's own lengths")
    ap.add_argument("--plan-only", action="store_true", help="only the planner's answers (no model, no GPU)")
    ap.add_argument("--override", action="append", default=[], metavar="KEY=VALUE", help="added to every cell")
    args = ap.parse_args()
    cells = parse_cells(args.cells)
    assets = Path(args.assets)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    if not args.plan_only:
        prepare_assets(assets)
        for shape in sorted({c[1] for c in cells}):      # built one at a time: they share the GPU and the disk
            build_model(Path(args.models), shape, assets / "tok")
    with ThreadPoolExecutor(max(1, args.jobs)) as pool:
        rows = list(pool.map(lambda c: run_cell(c, args, assets), cells))
    (Path(args.out) / "model_scale.json").write_text(json.dumps(rows, indent=1))
    print(table(rows))


if __name__ == "__main__":
    main()
