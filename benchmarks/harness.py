"""What the benchmarks share: the models, the stock command's settings, one timed run and its summary, the options.

The model built here (CLI below) is Qwen2.5-0.5B-shaped with random weights and the real tokenizer:
    python benchmarks/harness.py /tmp/qwen05b-random --tokenizer .gpu-assets/tok [--layers 2 --hidden 64]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
ARR = "actor_rollout_ref"
MODEL = os.environ.get("MODEL", "/tmp/qwen05b-random")
ASSETS = os.environ.get("ASSETS", ".gpu-assets")


def env(**extra) -> dict:
    """The environment of a child process: this checkout first on PYTHONPATH, unbuffered output."""
    out = dict(os.environ, PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false", **extra)
    out["PYTHONPATH"] = os.pathsep.join([str(ROOT), out.get("PYTHONPATH", "")])
    return out


def build_model(out: str, tokenizer: str, layers: int | None = None, hidden: int | None = None,
                shape_name: str = "qwen2.5-0.5b", init_device: str | None = "cpu", save_dtype: str = "float32") -> str:
    """Write a random-weight Qwen2.5-shaped model (optionally fewer layers / narrower, for CPU) with the real
    tokenizer. `init_device=None` draws the weights on the GPU if any (a 7B in seconds); `save_dtype` halves the files."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    from verl.compat.planning.model_spec import BUILTIN_MODELS

    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(Path(tokenizer) / name, folder / name)
    tok = AutoTokenizer.from_pretrained(folder)
    shape = {k: v for k, v in BUILTIN_MODELS[shape_name].items() if k != "model_type"}   # + Qwen2.5's numerics
    shape.update(rope_theta=1000000.0, rms_norm_eps=1e-6)
    shape["num_hidden_layers"] = layers or shape["num_hidden_layers"]
    if hidden is not None:   # heads, KV heads and MLP width shrink with the hidden size
        heads = max(2, hidden // (shape["hidden_size"] // shape["num_attention_heads"]))
        shape.update(hidden_size=hidden, num_attention_heads=heads, num_key_value_heads=max(1, heads // 2),
                     intermediate_size=4 * hidden)
    torch.manual_seed(0)
    with torch.device(init_device or ("cuda" if torch.cuda.is_available() else "cpu")):
        model = Qwen2ForCausalLM(Qwen2Config(**shape, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id))
    model.to(getattr(torch, save_dtype)).save_pretrained(folder)
    print(f"{folder}: {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M params, vocab {shape['vocab_size']}")
    return str(folder)


def ensure_model(model: str = MODEL, assets: str = ASSETS, **size) -> str:
    return model if (Path(model) / "config.json").exists() else build_model(model, f"{assets}/tok", **size)


def prepare_assets(assets: Path = ROOT / ASSETS) -> None:
    """GSM8K parquet files from the jsonl files in `assets/gsm8k` (examples/data_preprocess/gsm8k.py), and the
    full-length copy in `assets/gsm8k_long` (each question repeated 8 times)."""
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


def tiny_model(folder: str) -> str:   # CPU smoke runs of the in-process tools
    from verl.utils.tiny_model import build_tiny_model_dir

    return build_tiny_model_dir(folder, hidden_size=64, num_layers=2, intermediate_size=128, num_heads=4,
                                num_kv_heads=2)


def common(assets: str = ASSETS, model: str = MODEL) -> list[str]:
    """The overrides every end-to-end row shares: data, model, learning rates, loggers, no checkpoints."""
    return [f"data.train_files={assets}/gsm8k/train.parquet", f"data.val_files={assets}/gsm8k/test.parquet",
            f"{ARR}.model.path={model}", f"critic.model.path={model}", f"{ARR}.actor.optim.lr=1e-6",
            "critic.optim.lr=1e-5", "algorithm.kl_ctrl.kl_coef=0.001", f"{ARR}.rollout.name=vllm",
            f"{ARR}.rollout.tensor_model_parallel_size=1", "trainer.logger=[console,file]",
            "trainer.val_before_train=False", "trainer.n_gpus_per_node=1", "trainer.nnodes=1", "trainer.test_freq=-1",
            "trainer.total_epochs=15", "trainer.save_freq=-1", "trainer.resume_mode=disable"]


def shape(batch, mini, micro, log_prob_micro, ref_micro, prompt, response) -> dict:
    """Prompts per batch and per mini-batch, rows per micro-batch (update, log-prob, ref), lengths."""
    return dict(batch=batch, mini=mini, micro=micro, log_prob_micro=log_prob_micro, ref_micro=ref_micro,
                prompt=prompt, response=response)


SHAPES = {"field_report": shape(1, 1, 1, 1, 1, 256, 256),      # the field report (batch 1)
          "quickstart": shape(256, 64, 4, 8, 4, 512, 512),     # upstream's quick start (PPO + critic)
          "grpo": shape(64, 16, 16, 16, 16, 512, 512),         # GRPO 64 prompts (x 4 samples)
          "matrix": shape(8, 8, 4, 8, 8, 256, 128),            # the device matrix (matrix.py --settings matrix)
          "qwen_cpu": shape(2, 2, 1, 2, 2, 128, 32),           # a 2-layer Qwen on CPU: the real vocabulary
          "tiny": shape(2, 2, 1, 2, 2, 16, 4)}                 # the tiny test model


def sized(s: dict) -> list[str]:
    """A `shape()`'s batch, lengths and micro-batches as overrides (the critic's micro-batch last)."""
    return [f"data.train_batch_size={s['batch']}", f"data.max_prompt_length={s['prompt']}",
            f"data.max_response_length={s['response']}", f"{ARR}.actor.ppo_mini_batch_size={s['mini']}",
            f"{ARR}.actor.ppo_micro_batch_size_per_gpu={s['micro']}",
            f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu={s['log_prob_micro']}",
            f"{ARR}.ref.log_prob_micro_batch_size_per_gpu={s['ref_micro']}", f"critic.ppo_micro_batch_size_per_gpu={s['micro']}"]


QUICKSTART = [*sized(SHAPES["quickstart"]), f"{ARR}.rollout.gpu_memory_utilization=0.4"]
# the field report's settings under the simulated P40: batch 1, 256 + 256 tokens
P40 = ["compat.device=p40", *sized(SHAPES["field_report"]), "data.filter_overlong_prompts=True",
       f"{ARR}.rollout.gpu_memory_utilization=0.3"]
# what the field report set by hand: float32, eager attention, every offload, fixed micro-batches
P40_MANUAL = P40 + [f"{ARR}.actor.fsdp_config.dtype=float32", f"{ARR}.actor.fsdp_config.model_dtype=float32",
                    f"{ARR}.ref.fsdp_config.dtype=float32", "critic.fsdp.dtype=float32", "critic.fsdp.model_dtype=float32",
                    f"{ARR}.rollout.dtype=float32", f"{ARR}.model.attn_implementation=eager",
                    "critic.model.attn_implementation=eager", f"{ARR}.actor.fsdp_config.param_offload=True",
                    f"{ARR}.actor.fsdp_config.optimizer_offload=True", f"{ARR}.ref.fsdp_config.param_offload=True",
                    "critic.fsdp.param_offload=True", "critic.fsdp.optimizer_offload=True",
                    f"{ARR}.actor.use_dynamic_bsz=False"]
# GRPO: 64 prompts x 4 samples, 512 + 512 tokens, KL loss
GRPO_SHAPE = dict(prompts=64, n=4, prompt=512, response=512)
GRPO_ALGO = ["algorithm.adv_estimator=grpo", f"{ARR}.actor.use_kl_loss=True", f"{ARR}.actor.kl_loss_coef=0.001",
             f"{ARR}.actor.kl_loss_type=low_var_kl", f"{ARR}.actor.entropy_coeff=0", "algorithm.use_kl_in_reward=False"]
GRPO = [*sized(SHAPES["grpo"])[:-1], f"{ARR}.rollout.n=4", *GRPO_ALGO]


def launch_main_ppo(overrides: list[str], jsonl: Path, log: Path, timeout: float, **env_extra) -> dict:
    """Run `python -m verl.trainer.main_ppo` once: {exit, wall_s, cold_start_to_first_step_s, command}.

    The cold start is the wall time from launch to the first step's record in the file logger's JSONL."""
    jsonl.unlink(missing_ok=True)
    cmd = [sys.executable, "-m", "verl.trainer.main_ppo", *overrides]

    def first_step_logged() -> bool:
        return jsonl.exists() and '"timing_s/step"' in jsonl.read_text()

    start, cold = time.perf_counter(), None
    with open(log, "w") as fp:
        proc = subprocess.Popen(cmd, stdout=fp, stderr=subprocess.STDOUT, cwd=ROOT,
                                env=env(VERL_FILE_LOGGER_PATH=str(jsonl), **env_extra))
        while proc.poll() is None:
            if cold is None and first_step_logged():
                cold = time.perf_counter() - start
            if time.perf_counter() - start > timeout:
                proc.kill()
                break
            time.sleep(0.1)
        proc.wait()
    wall = time.perf_counter() - start
    if cold is None and first_step_logged():
        cold = wall   # the step landed between the last poll and the exit
    takeover = re.findall(r"compiled code takes over after ([0-9.]+) s", log.read_text(errors="replace"))
    return {"exit": proc.returncode, "wall_s": round(wall, 1), "command": " ".join(cmd[1:]),
            "cold_start_to_first_step_s": None if cold is None else round(cold, 2),
            # seconds from each worker's start to its switch to compiled code (compat.compile_warmup=background)
            "compile_takeover_s": [float(t) for t in takeover]}


TIMINGS = ("gen", "reward", "old_log_prob", "ref", "values", "adv", "update_critic", "update_actor", "step")
MEMORY = ("perf/predicted_peak_gb", "perf/max_memory_allocated_gb", "perf/max_memory_reserved_gb",
          "perf/cpu_memory_used_gb")


def summarize(path) -> dict:
    """s/step (median over the compiled steps after the first, which carries warm-up; where the plan compiles
    beside eager first steps, `perf/compiled_layers` 0, those are counted apart), phases, memory, skipped updates."""
    rows = [json.loads(line)["data"] for line in Path(path).read_text().splitlines() if line.strip()]
    steps = [r for r in rows if "timing_s/step" in r]
    if not steps:
        raise SystemExit(f"{path}: no training steps logged")
    eager = [s for s in steps if s.get("perf/compiled_layers") == 0]
    timed = [s for s in steps[1:] if s.get("perf/compiled_layers") != 0] or steps[1:] or steps

    def median(key):
        values = [s[key] for s in timed if isinstance(s.get(key), (int, float))]
        return round(statistics.median(values), 4) if values else None

    phase_keys = sorted({k for s in steps for k in s if k.startswith("perf/max_memory_allocated_gb/")})
    return {
        "steps": len(steps), "s_per_step": median("timing_s/step"), "first_step_s": round(steps[0]["timing_s/step"], 3),
        # seconds torch.compile ran in the workers' passes of the first step (absent where nothing compiles)
        "first_step_compile_s": steps[0].get("perf/compile_s"),
        # background compile warm-up: the steps that ran eager code while the compiled code was built
        "eager_steps": len(eager),
        "eager_s_per_step": round(statistics.median(s["timing_s/step"] for s in eager), 4) if eager else None,
        "timing_s": {k: median(f"timing_s/{k}") for k in TIMINGS},
        "mfu": {k: median(f"perf/mfu/{k}") for k in ("actor", "critic")},
        "memory_gb": {k: max((s[k] for s in steps if isinstance(s.get(k), (int, float))), default=None) for k in MEMORY},
        # the allocator's peak so far at each step (it never resets: a step after a validation carries its peak)
        "max_allocated_gb_by_step": [s.get("perf/max_memory_allocated_gb") for s in steps],
        # each worker call's own peak (perf/max_memory_allocated_gb/<phase>), largest over the run
        "phase_peak_gb": {k.rsplit("/", 1)[-1]: max(s[k] for s in steps if isinstance(s.get(k), (int, float)))
                          for k in phase_keys},
        # a step whose optimizer step was skipped on a non-finite grad norm learned nothing; its timing has no step
        # (the file logger writes a non-finite norm as the string "nan" / "inf")
        "skipped_updates": {role: sum(1 for s in steps if str(s.get(f"{role}/grad_norm", 0)) in ("nan", "inf", "-inf"))
                            for role in ("actor", "critic")},
        # the trainer's start-up breakdown, carried by the first step's record (verl/utils/startup/clock.py)
        "startup_s": {k.removeprefix("timing_s/startup").lstrip("/") or "total": round(v, 3)
                      for k, v in steps[0].items() if k.startswith("timing_s/startup")},
        "throughput_tokens_per_s": median("perf/throughput"),
    }


def parser(doc: str, out: str) -> argparse.ArgumentParser:
    """A tool's command line: its docstring's first line and `--out`, the folder its results go to."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--out", default=out, help="folder for the results")
    return ap


def worker_options(ap: argparse.ArgumentParser, profiles: str, settings: str, names,
                   tiny: str = "the tiny test model (CPU smoke runs)") -> None:
    """The options of the tools on the real workers (profile_step.py, memory_model.py)."""
    ap.add_argument("--profiles", default=profiles, help="catalog names (compat.device); cpu on a CPU-only host")
    ap.add_argument("--settings", default=settings, help=f"comma-separated: {', '.join(names)}")
    ap.add_argument("--model", default=MODEL, help="model folder (harness.py)")
    ap.add_argument("--tiny", action="store_true", help=tiny)
    ap.add_argument("--override", action="append", default=[], metavar="KEY=VALUE", help="more Hydra overrides")


if __name__ == "__main__":   # build the model
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--tokenizer", required=True, help="folder with tokenizer.json + tokenizer_config.json")
    ap.add_argument("--layers", type=int)
    ap.add_argument("--hidden", type=int)
    build_model(**vars(ap.parse_args()))
