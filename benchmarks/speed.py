"""End-to-end speed of the stock `python -m verl.trainer.main_ppo`, one row per setting, TRL beside it.

Rows: harness.py's settings (p40 unsimulated without a GPU); trl: TRL's GRPOTrainer on the GRPO shape, if installed.

    python benchmarks/speed.py --rows quickstart,p40,grpo --steps 3 --out DIR [--extra KEY=VALUE ...]
    python benchmarks/speed.py --rows p40 --steps 1 --repeat 4 --out DIR          # cold start
    python benchmarks/speed.py --rows grpo --steps 12 --out DIR --extra compat.compile_warmup=synchronous  # compile first
    MODEL=/tmp/qwen-tiny python benchmarks/speed.py --rows p40 --steps 1 --repeat 3 --extra data.max_response_length=16  # CPU
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402

ROWS = {"quickstart": harness.QUICKSTART, "p40": harness.P40, "p40_manual": harness.P40_MANUAL,
        "grpo": harness.GRPO, "trl": None}


def run_row(name: str, steps: int, timeout: int, out: Path, extra: list[str], gpu: bool) -> dict:
    """One main_ppo run: its launch record and the summary of its steps."""
    jsonl, log = out / f"{name}.jsonl", out / f"{name}.log"
    settings = [o for o in ROWS[name.rsplit("_", 1)[0]] if gpu or not o.startswith("compat.device=")]
    overrides = [*harness.common(), *settings, *extra, f"trainer.total_training_steps={steps}"]
    row = {"name": name, **harness.launch_main_ppo(overrides, jsonl, log, timeout)}
    try:
        row.update(harness.summarize(jsonl))
    except SystemExit as err:   # no step logged: keep the log's tail for the report
        row.update(error=str(err), log_tail=log.read_text()[-3000:])
    return row


def repeated(name: str, args, out: Path, gpu: bool) -> dict:
    """The row run `--repeat` times: the last run's summary, the median cold start and start-up stages."""
    runs = [run_row(f"{name}_{i}", args.steps, args.timeout, out, args.extra, gpu) for i in range(args.repeat)]
    ok = [r for r in runs if r.get("startup_s")]
    stages = dict.fromkeys(k for r in ok for k in r["startup_s"])
    median = lambda values: round(statistics.median(values), 2) if values else None  # noqa: E731
    return {**runs[-1], "name": name, "exits": [r["exit"] for r in runs],
            "cold_start_to_first_step_s": median([r["cold_start_to_first_step_s"] for r in ok]),
            "cold_start_runs_s": [r["cold_start_to_first_step_s"] for r in runs],
            # per run (a fresh compile cache first, then the one it left): switch to compiled code, eager steps
            "compile_takeover_runs_s": [r.get("compile_takeover_s") for r in runs],
            "eager_steps_runs": [r.get("eager_steps") for r in runs],
            "startup_s": {k: median([r["startup_s"][k] for r in ok if k in r["startup_s"]]) for k in stages}}


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
per_device = n * 4   # accumulation makes prompts x n completions per optimizer step
wanted = dict(output_dir="/tmp/trl_grpo", max_steps=steps, per_device_train_batch_size=per_device,
              gradient_accumulation_steps=prompts * n // per_device, num_generations=n,
              max_completion_length=new, max_prompt_length=plen, beta=0.001, bf16=torch.cuda.is_available(),
              use_cpu=not torch.cuda.is_available(), learning_rate=1e-6, logging_steps=1, save_strategy="no",
              report_to=[])
fields = set(GRPOConfig.__dataclass_fields__)
print("GRPOConfig fields not in this TRL:", sorted(set(wanted) - fields), flush=True)
trainer = GRPOTrainer(model=model, reward_funcs=reward, args=GRPOConfig(**{k: v for k, v in wanted.items() if k in fields}),
                      train_dataset=ds, processing_class=AutoTokenizer.from_pretrained(model), callbacks=[Clock()])
trainer.train()
'''


def run_trl(steps: int, timeout: int, out: Path) -> dict:
    try:
        import trl  # noqa: F401
    except ImportError:
        return {"name": "trl", "skipped": "trl is not installed (README: the TRL row)"}
    result, log, g = out / "trl.json", out / "trl.log", harness.GRPO_SHAPE
    cmd = [sys.executable, "-c", TRL_SCRIPT, harness.MODEL, f"{harness.ASSETS}/gsm8k/train.parquet", str(steps),
           *(str(g[k]) for k in ("prompts", "n", "prompt", "response")), str(result)]
    with open(log, "w") as fp:
        try:
            code = subprocess.run(cmd, stdout=fp, stderr=subprocess.STDOUT, env=harness.env(), timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
    row = {"name": "trl", "exit": code}
    if result.exists():
        step_s = json.loads(result.read_text())["step_s"]
        row.update(step_s=[round(s, 2) for s in step_s], s_per_step=round(statistics.median(step_s[1:] or step_s), 2))
    else:
        row["log_tail"] = log.read_text()[-3000:]
    return row


def table(rows: dict) -> str:
    """One line per row: s/step (compiled steps), first step, the first step line after launch, eager steps while the
    compiled code was built and when it took over, peak memory, MFU; then its phases."""
    phases = ("gen", "old_log_prob", "ref", "values", "update_critic", "update_actor")
    lines = ["| row | exit | s/step | first step s (compiling) | first step line s | eager steps (s/step) | takeover s | peak GiB | "
             "actor MFU | " + " | ".join(phases) + " |",
             "|" + "---|" * (9 + len(phases))]
    for name, r in rows.items():
        mfu = (r.get("mfu") or {}).get("actor")
        timing = r.get("timing_s") or {}
        eager = f"{r.get('eager_steps')} ({r.get('eager_s_per_step')})" if r.get("eager_steps") else r.get("eager_steps")
        takeover = ", ".join(str(t) for t in r.get("compile_takeover_s") or []) or "-"
        compiling = r.get("first_step_compile_s")
        first = r.get("first_step_s") if compiling is None else f"{r.get('first_step_s')} ({compiling:.1f})"
        lines.append(f"| {name} | {r.get('exit', r.get('skipped'))} | {r.get('s_per_step')} | {first} | "
                     f"{r.get('cold_start_to_first_step_s')} | {eager} | {takeover} | "
                     f"{(r.get('memory_gb') or {}).get('perf/max_memory_allocated_gb')}"
                     f" | {'-' if mfu is None else f'{100 * mfu:.1f}%'} | " + " | ".join(str(timing.get(p)) for p in phases)
                     + " |")
        if skipped := {k: v for k, v in (r.get("skipped_updates") or {}).items() if v}:
            lines.append(f"\nWARNING {name}: optimizer steps skipped on a non-finite grad norm {skipped}: "
                         "its timings include no optimizer step\n")
    stages = list(dict.fromkeys(k for r in rows.values() for k in r.get("startup_s") or {}))
    lines += ["", "| start-up stage, s | " + " | ".join(rows) + " |", "|---|" + "---|" * len(rows)]
    lines += [f"| {k} | " + " | ".join(str((r.get("startup_s") or {}).get(k, "")) for r in rows.values()) + " |"
              for k in stages]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = harness.parser(__doc__, "speed_out")
    ap.add_argument("--rows", default="quickstart,p40,grpo,trl", help=f"comma-separated: {', '.join(ROWS)}")
    ap.add_argument("--steps", type=int, default=3, help="training steps per row (the first is warm-up)")
    ap.add_argument("--timeout", type=int, default=240, help="seconds per run")
    ap.add_argument("--repeat", type=int, default=1, help="runs per row (cold start: medians over them)")
    ap.add_argument("--extra", nargs="*", default=[], help="more Hydra overrides for every main_ppo row")
    args = ap.parse_args(argv)
    wanted = [r for r in args.rows.split(",") if r]
    if unknown := sorted(set(wanted) - set(ROWS)):
        ap.error(f"unknown rows {unknown}; choose from {', '.join(ROWS)}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    harness.ensure_model()
    harness.prepare_assets()   # the rows read GSM8K's parquet files
    import torch

    gpu, rows = torch.cuda.is_available(), {}
    for name in wanted:
        rows[name] = run_trl(args.steps, args.timeout, out) if name == "trl" else repeated(name, args, out, gpu)
        print(f"{name}: exit {rows[name].get('exit')}, {rows[name].get('s_per_step')} s/step", flush=True)
    (out / "speed.json").write_text(json.dumps(rows, indent=1))
    print(table(rows))
    return 0 if all(set(r.get("exits", [r.get("exit", 0)])) == {0} for r in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
