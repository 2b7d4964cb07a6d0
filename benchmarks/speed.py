"""Every speed row of issue 8's goals table on the present GPU, in one command: one JSON and one table.

Rows (stock `python -m verl.trainer.main_ppo` on a Qwen2.5-0.5B-shaped model with random weights, the
real Qwen tokenizer and GSM8K, as `benchmarks/gpu_e2e.sh`; each run in its own process):
  quickstart     upstream's quick-start shape, our plan (PPO, batch 256, 512+512, micro 4): s/step,
                 phases, actor/critic MFU (perf/mfu/*), cold start
  p40            the field report's settings under the simulated P40 profile, our plan (batch 1,
                 256+256): s/step, peak memory, cold start
  p40_manual     the same with the field report's manual plan (float32, eager attention, full offload,
                 micro-batch 1, fixed micro-batches)
  grpo           GRPO, 64 prompts x 4 samples x 512 new tokens, bf16 plan, KL loss: s/step
  trl            TRL's GRPOTrainer on the GRPO row's shape (only when `trl` imports)
  rollout        the built-in engine rows, from `benchmarks/rollout_speed.py` (when present)

s/step is the median over the steps after the first (summarize_run.py). Cold start is the wall time
from launching the process to the first step's metrics line in the file logger's JSONL (process start,
Ray, model loads, sharding, first rollout and update included). Actor MFU is upstream's perf/mfu/actor:
model FLOPs of the update (6 x matmul params x tokens + attention, per pass and PPO epoch) over the
update's time and the device profile's dense bf16 peak.

    python benchmarks/speed.py [--out DIR]
    SPEED_ROWS=quickstart,grpo QS_STEPS=3 P40_STEPS=10 python benchmarks/speed.py

Env: SPEED_ROWS (default all rows above), QS_STEPS (3), P40_STEPS (10), MANUAL_STEPS (3), GRPO_STEPS (3),
TRL_STEPS (2), *_TIMEOUT per row in seconds, ASSETS (.gpu-assets: tok/ and gsm8k/*.parquet), MODEL
(/tmp/qwen05b-random, built by build_qwen_shaped.py when missing), SPEED_EXTRA (space-separated overrides
added to every main_ppo row), ROLLOUT_ARGS (extra arguments for
rollout_speed.py, default --skip-old). About 8 minutes of H200 time with the defaults.
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
from summarize_run import summarize  # noqa: E402

ALL_ROWS = ("quickstart", "p40", "p40_manual", "grpo", "trl", "rollout")


def common(assets: str, model: str) -> list[str]:
    """The overrides every main_ppo row shares (gpu_e2e.sh's)."""
    return [f"data.train_files={assets}/gsm8k/train.parquet", f"data.val_files={assets}/gsm8k/test.parquet",
            f"actor_rollout_ref.model.path={model}", f"critic.model.path={model}",
            "actor_rollout_ref.actor.optim.lr=1e-6", "critic.optim.lr=1e-5", "algorithm.kl_ctrl.kl_coef=0.001",
            "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
            "trainer.logger=[console,file]", "trainer.val_before_train=False", "trainer.n_gpus_per_node=1",
            "trainer.nnodes=1", "trainer.test_freq=-1", "trainer.total_epochs=15",
            "trainer.save_freq=-1", "trainer.resume_mode=disable"]


QUICKSTART = ["data.train_batch_size=256", "data.max_prompt_length=512", "data.max_response_length=512",
              "actor_rollout_ref.actor.ppo_mini_batch_size=64", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
              "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
              "actor_rollout_ref.rollout.gpu_memory_utilization=0.4",
              "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4", "critic.ppo_micro_batch_size_per_gpu=4"]
P40 = ["compat.device=p40", "data.train_batch_size=1", "data.max_prompt_length=256", "data.max_response_length=256",
       "data.filter_overlong_prompts=True", "actor_rollout_ref.actor.ppo_mini_batch_size=1",
       "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
       "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
       "actor_rollout_ref.rollout.gpu_memory_utilization=0.3",
       "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1", "critic.ppo_micro_batch_size_per_gpu=1"]
# What the field report set by hand on its P40: float32 everywhere, eager attention, every offload on,
# micro-batch 1 (fixed micro-batches, as upstream's default).
P40_MANUAL = P40 + ["actor_rollout_ref.actor.fsdp_config.dtype=float32",
                    "actor_rollout_ref.actor.fsdp_config.model_dtype=float32",
                    "actor_rollout_ref.ref.fsdp_config.dtype=float32", "critic.fsdp.dtype=float32",
                    "critic.fsdp.model_dtype=float32", "actor_rollout_ref.rollout.dtype=float32",
                    "actor_rollout_ref.model.attn_implementation=eager", "critic.model.attn_implementation=eager",
                    "actor_rollout_ref.actor.fsdp_config.param_offload=True",
                    "actor_rollout_ref.actor.fsdp_config.optimizer_offload=True",
                    "actor_rollout_ref.ref.fsdp_config.param_offload=True",
                    "critic.fsdp.param_offload=True", "critic.fsdp.optimizer_offload=True",
                    "actor_rollout_ref.actor.use_dynamic_bsz=False"]
GRPO_PROMPTS, GRPO_N, GRPO_PROMPT_LEN, GRPO_NEW = 64, 4, 512, 512
GRPO = ["algorithm.adv_estimator=grpo", f"data.train_batch_size={GRPO_PROMPTS}",
        f"data.max_prompt_length={GRPO_PROMPT_LEN}", f"data.max_response_length={GRPO_NEW}",
        f"actor_rollout_ref.rollout.n={GRPO_N}", "actor_rollout_ref.actor.ppo_mini_batch_size=16",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16",
        "actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.actor.kl_loss_coef=0.001",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl", "actor_rollout_ref.actor.entropy_coeff=0",
        "algorithm.use_kl_in_reward=False"]


def _env(name: str, default):
    return type(default)(os.environ.get(name, default))


def run_main_ppo(name: str, overrides: list[str], steps: int, timeout: int, out: Path, base: list[str]) -> dict:
    """One stock main_ppo run; its summary plus the cold start read off the JSONL as it is written."""
    jsonl, log = out / f"{name}.jsonl", out / f"{name}.log"
    row = {"name": name, **launch_main_ppo([*base, *overrides, f"trainer.total_training_steps={steps}"], jsonl, log,
                                           timeout)}
    try:
        row.update(summarize(str(jsonl)))
        steps_logged = [json.loads(line)["data"] for line in jsonl.read_text().splitlines() if line.strip()]
        steps_logged = [s for s in steps_logged if "timing_s/step" in s]
        timed = steps_logged[1:] or steps_logged
        for key in ("perf/mfu/actor", "perf/mfu/critic"):
            values = [s[key] for s in timed if isinstance(s.get(key), (int, float))]
            row[key] = round(statistics.median(values), 4) if values else None
        row["max_memory_allocated_gb_per_step"] = [round(s.get("perf/max_memory_allocated_gb", 0.0), 2)
                                                   for s in steps_logged]
        # the trainer's start-up breakdown rides on the first step's record (verl/utils/startup.py)
        row["startup_s"] = {k.removeprefix("timing_s/startup").lstrip("/") or "total": round(v, 2)
                            for k, v in (steps_logged[0] if steps_logged else {}).items()
                            if k.startswith("timing_s/startup")}
    except SystemExit as err:   # no step logged: keep the log's tail for the report
        row["error"] = str(err)
        row["log_tail"] = log.read_text()[-3000:]
    print(f"{name}: exit {row['exit']}, {row.get('s_per_step')} s/step, cold start {row['cold_start_to_first_step_s']} s "
          f"(start-up {row.get('startup_s', {}).get('total')} s, first step {row.get('first_step_s')} s)", flush=True)
    return row


TRL_SCRIPT = r'''
import json, sys, time
import datasets, torch
from transformers import AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer
from verl.utils.reward_score import default_compute_score

model, train_file, steps, prompts, n, plen, new, out = sys.argv[1:9]
steps, prompts, n, plen, new = int(steps), int(prompts), int(n), int(plen), int(new)
rows = datasets.load_dataset("parquet", data_files=train_file, split="train")
ds = datasets.Dataset.from_dict({"prompt": [r["prompt"] for r in rows],
                                 "ground_truth": [r["reward_model"]["ground_truth"] for r in rows]})
def reward(completions, ground_truth, **_):
    text = [c if isinstance(c, str) else c[-1]["content"] for c in completions]
    return [float(default_compute_score("openai/gsm8k", t, g)) for t, g in zip(text, ground_truth)]
times = []
class Clock(TrainerCallback):
    def on_step_begin(self, args, state, control, **kw): self.t = time.perf_counter()
    def on_step_end(self, args, state, control, **kw):   # written every step: a timeout keeps the steps done
        times.append(time.perf_counter() - self.t)
        json.dump({"step_s": times}, open(out, "w"))
per_device = n * 4   # 16 completions per forward; accumulation makes prompts x n completions per optimizer step
wanted = dict(output_dir="/tmp/trl_grpo", max_steps=steps, per_device_train_batch_size=per_device,
              gradient_accumulation_steps=prompts * n // per_device, num_generations=n,
              max_completion_length=new, max_prompt_length=plen, beta=0.001, bf16=torch.cuda.is_available(),
              use_cpu=not torch.cuda.is_available(),   # so the script also runs (slowly) on a CPU, to check it
              learning_rate=1e-6, logging_steps=1, save_strategy="no", report_to=[])
fields = set(GRPOConfig.__dataclass_fields__)
print("GRPOConfig fields not in this TRL:", sorted(set(wanted) - fields), flush=True)
config = GRPOConfig(**{k: v for k, v in wanted.items() if k in fields})
trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=ds,
                      processing_class=AutoTokenizer.from_pretrained(model), callbacks=[Clock()])
trainer.train()
json.dump({"step_s": times}, open(out, "w"))
'''


def run_trl(steps: int, timeout: int, out: Path, assets: str, model: str) -> dict:
    result = out / "trl.json"
    log = out / "trl.log"
    cmd = [sys.executable, "-c", TRL_SCRIPT, model, f"{assets}/gsm8k/train.parquet", str(steps), str(GRPO_PROMPTS),
           str(GRPO_N), str(GRPO_PROMPT_LEN), str(GRPO_NEW), str(result)]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"}
    with open(log, "w") as fp:
        try:
            code = subprocess.run(cmd, stdout=fp, stderr=subprocess.STDOUT, env=env, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
    row = {"name": "trl", "exit": code, "command": "python -c TRL_SCRIPT (benchmarks/speed.py)"}
    if result.exists():
        step_s = json.loads(result.read_text())["step_s"]
        row["step_s"] = [round(s, 2) for s in step_s]
        row["s_per_step"] = round(statistics.median(step_s[1:] or step_s), 2)
    else:
        row["log_tail"] = log.read_text()[-3000:]
    print(f"trl: exit {code}, {row.get('s_per_step')} s/step", flush=True)
    return row


def run_rollout(out: Path, timeout: int) -> dict:
    script = ROOT / "benchmarks" / "rollout_speed.py"
    if not script.exists():
        return {"name": "rollout", "skipped": "benchmarks/rollout_speed.py is not in this checkout"}
    folder = out / "rollout"
    folder.mkdir(exist_ok=True)
    extra = os.environ.get("ROLLOUT_ARGS", "--skip-old").split()
    cmd = [sys.executable, str(script), "--out", str(folder), *extra]
    try:
        code = subprocess.run(cmd, cwd=ROOT, timeout=timeout).returncode
    except subprocess.TimeoutExpired:
        code = "timeout"
    found = folder / "rollout_speed.json"
    return {"name": "rollout", "exit": code, "result": json.loads(found.read_text()) if found.exists() else None}


def table(rows: dict) -> str:
    """The goals table of issue 8 with this run's figures."""
    def get(name, key):
        value = rows.get(name, {}).get(key)
        return "n/a" if value is None else value

    qs, p40, manual, grpo, trl = (rows.get(k, {}) for k in ("quickstart", "p40", "p40_manual", "grpo", "trl"))
    mem = (p40.get("memory_gb") or {}).get("perf/max_memory_allocated_gb")
    mfu = qs.get("perf/mfu/actor")
    lines = ["| measure | ours | beside it | goal |", "|---|---|---|---|",
             f"| quick-start shape, bf16, s/step | {get('quickstart', 's_per_step')} "
             f"(first {get('quickstart', 'first_step_s')}) | | <= 10 |",
             f"| field report under the p40 profile, s/step | {get('p40', 's_per_step')} (peak {mem} GB) | "
             f"manual plan: {get('p40_manual', 's_per_step')} | <= 2.5, memory <= 14 GB |",
             f"| GRPO 64 x 4 x 512 new, bf16, KL loss, s/step | {get('grpo', 's_per_step')} | "
             f"TRL GRPOTrainer: {get('trl', 's_per_step')} | <= 6 |",
             f"| actor update MFU, bf16 (quick-start) | {'n/a' if mfu is None else f'{100 * mfu:.1f}%'} | "
             f"critic {qs.get('perf/mfu/critic')} | >= 35% |",
             f"| cold start to first step, s (quick-start / p40) | {get('quickstart', 'cold_start_to_first_step_s')} / "
             f"{get('p40', 'cold_start_to_first_step_s')} | manual: {get('p40_manual', 'cold_start_to_first_step_s')}"
             f" | <= 15 |"]
    roll = rows.get("rollout", {}).get("result")
    if roll:
        lines.append(f"| built-in rollout rows | see rollout/rollout_speed.json: {json.dumps(roll)[:300]} | | |")
    phases = ["", "| run | s/step | " + " | ".join(k for k in ("gen", "old_log_prob", "ref", "values",
                                                                 "update_critic", "update_actor")) + " |",
              "|---|---|---|---|---|---|---|---|"]
    for name in ("quickstart", "p40", "p40_manual", "grpo"):
        r = rows.get(name)
        if r and r.get("timing_s"):
            t = r["timing_s"]
            phases.append(f"| {name} | {r['s_per_step']} | " + " | ".join(
                str(t.get(k)) for k in ("gen", "old_log_prob", "ref", "values", "update_critic", "update_actor")) + " |")
    for name in ("quickstart", "p40", "p40_manual", "grpo"):
        skipped = {k: v for k, v in (rows.get(name, {}).get("skipped_updates") or {}).items() if v}
        if skipped:
            phases.append(f"\nWARNING {name}: optimizer steps skipped on a non-finite grad norm {skipped} "
                          f"(of {rows[name]['steps']} steps): its timings include no optimizer step")
    return "\n".join(lines + phases) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "./speed_out"))
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    assets = os.environ.get("ASSETS", ".gpu-assets")
    model = os.environ.get("MODEL", "/tmp/qwen05b-random")
    wanted = [r for r in os.environ.get("SPEED_ROWS", ",".join(ALL_ROWS)).split(",") if r]
    if not (Path(model) / "config.json").exists():
        subprocess.run([sys.executable, str(ROOT / "benchmarks" / "build_qwen_shaped.py"), model,
                        "--tokenizer", f"{assets}/tok"], check=True)
    base = common(assets, model) + os.environ.get("SPEED_EXTRA", "").split()
    runs = {
        "quickstart": lambda: run_main_ppo("quickstart", QUICKSTART, _env("QS_STEPS", 3),
                                           _env("QS_TIMEOUT", 240), out, base),
        "p40": lambda: run_main_ppo("p40", P40, _env("P40_STEPS", 10), _env("P40_TIMEOUT", 120), out, base),
        "p40_manual": lambda: run_main_ppo("p40_manual", P40_MANUAL, _env("MANUAL_STEPS", 3),
                                           _env("MANUAL_TIMEOUT", 120), out, base),
        "grpo": lambda: run_main_ppo("grpo", GRPO, _env("GRPO_STEPS", 3), _env("GRPO_TIMEOUT", 180), out, base),
        "trl": lambda: run_trl(_env("TRL_STEPS", 2), _env("TRL_TIMEOUT", 150), out, assets, model),
        "rollout": lambda: run_rollout(out, _env("ROLLOUT_TIMEOUT", 150)),
    }
    unknown = sorted(set(wanted) - set(runs))
    if unknown:
        raise SystemExit(f"unknown SPEED_ROWS {unknown}; choose from {', '.join(ALL_ROWS)}")
    rows = {}
    for name in wanted:
        if name == "trl":
            try:
                import trl  # noqa: F401
            except ImportError:
                rows["trl"] = {"name": "trl", "skipped": "trl is not installed"}
                continue
        rows[name] = runs[name]()
    try:
        import torch

        device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    except Exception as err:  # noqa: BLE001 - the report still gets written
        device = f"unknown ({err})"
    report = {"device": device, "rows": rows}
    (out / "speed.json").write_text(json.dumps(report, indent=1))
    md = f"# Speed rows on {device}\n\n" + table(rows)
    (out / "speed.md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
