"""Speed of the built-in rollout engine (HFRollout) on the present GPU, old decode path beside the new.

Two cases on a Qwen2.5-0.5B-shaped model with random weights, each planned by verl.compat for its profile:
  p40   one sequence, 256 prompt + 256 new tokens, under the simulated P40 profile (float32, its
        memory cap, TF32 off): decode ms/token.
  h200  256 sequences, 512 prompt (left-padded, 256..512 real tokens) + 512 new tokens, under the
        real device's plan (bfloat16): tokens/s.
  h200_eager  the same with torch.compile off in the plan (decode step not compiled, still a graph).
  h200_short  the h200 shape with GSM8K-like prompts: 60..200 real tokens left-padded to 512 (the
        engine trims the common padding before prefill, so its cache is ~256 + 512 slots, not 1,024).
"new" is the static-cache decoder (CUDA graphs where the plan allows them); "old" is the HF forward
per token with its growing cache (the path models the static decoder cannot run still take).
Sampling is upstream's default (temperature 1, no top-k/top-p), with ignore_eos so every row runs to
full length. Each case runs in its own process (a simulated profile caps that process's memory).

    python benchmarks/rollout_speed.py [--out DIR] [--skip-old] [--cases p40,h200,h200_eager]

Prints a table and writes rollout_speed.json to --out (default $OUT, else the current directory).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

CASES = {
    "p40": {"simulate": "p40", "batch": 1, "prompt": 256, "response": 256},
    "h200": {"simulate": None, "batch": 256, "prompt": 512, "response": 512},
    # the same with torch.compile off in the plan: the decode step replayed as a graph but not compiled
    "h200_eager": {"simulate": None, "batch": 256, "prompt": 512, "response": 512, "use_torch_compile": False},
    "h200_short": {"simulate": None, "batch": 256, "prompt": 512, "response": 512, "lengths": (60, 200)},
}
EOS = PAD = 151643  # Qwen's <|endoftext|>; the random model's prompts are random ids below it
GREEDY_CHECK_TOKENS = 64


def _plan_and_model(case: dict):
    import torch
    from build_qwen_shaped import QWEN25_05B
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from verl.compat import apply_in_process, torch_dtype
    from verl.compat.detect import detect_profile, detect_software
    from verl.compat.model_spec import ModelSpec
    from verl.compat.planner import make_plan

    hf_config = Qwen2Config(**QWEN25_05B, eos_token_id=EOS, pad_token_id=PAD)
    config = {"data": {"train_batch_size": case["batch"], "max_prompt_length": case["prompt"],
                       "max_response_length": case["response"]},
              "actor_rollout_ref": {"actor": {"ppo_mini_batch_size": case["batch"], "ppo_micro_batch_size_per_gpu": 1,
                                              "use_torch_compile": case.get("use_torch_compile", "auto")},
                                    "rollout": {"name": "hf", "log_prob_micro_batch_size_per_gpu": 1},
                                    "ref": {"log_prob_micro_batch_size_per_gpu": 1}},
              "critic": {"ppo_micro_batch_size_per_gpu": 1},
              "algorithm": {"adv_estimator": "grpo", "use_kl_in_reward": False},
              "trainer": {"n_gpus_per_node": 1, "nnodes": 1}}
    profile = detect_profile(case["simulate"])
    plan = make_plan(profile, config, detect_software(profile), ModelSpec.from_hf_config(hf_config))
    device = apply_in_process(plan, 0)
    # inside the actor worker the engine sees the weights FSDP gathered in the rollout dtype
    with torch.device(device):
        model = Qwen2ForCausalLM(hf_config)
    return plan, model.to(torch_dtype(plan.rollout.dtype)).eval(), device


def _prompts(case: dict, device):
    import torch

    from verl.protocol import DataProto

    g = torch.Generator().manual_seed(0)
    batch, width = case["batch"], case["prompt"]
    low, high = case.get("lengths", (width // 2, width))
    lengths = torch.randint(low, high + 1, (batch,), generator=g) if batch > 1 else torch.tensor([high])
    ids = torch.full((batch, width), PAD, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lengths.tolist()):
        ids[i, width - n:] = torch.randint(0, EOS, (n,), generator=g)
        mask[i, width - n:] = 1
    pos = torch.clamp(mask.cumsum(-1) - 1, min=0)
    return DataProto.from_dict(tensors={"input_ids": ids, "attention_mask": mask, "position_ids": pos},
                               meta_info={"eos_token_id": EOS, "pad_token_id": PAD}).to(device)


def _engine(model, plan, response, path: str, do_sample=True):
    from verl.workers.rollout import HFRollout

    cfg = {"temperature": 1.0, "top_k": -1, "top_p": 1.0, "do_sample": do_sample, "response_length": response,
           "seed": 0, "ignore_eos": True}
    engine = HFRollout(model, cfg, plan=plan)
    if path == "old":  # the HF forward per token, as before the static decoder
        engine.static_unsupported = lambda: "benchmark: old path"
    return engine


def _timed(engine, batch, response):
    import torch

    batch.meta_info["response_length"] = response
    torch.cuda.synchronize()
    start = time.perf_counter()
    out = engine.generate_sequences(batch)
    torch.cuda.synchronize()
    return time.perf_counter() - start, out


def run_case(name: str, skip_old: bool) -> dict:
    import torch

    case = CASES[name]
    plan, model, device = _plan_and_model(case)
    batch = _prompts(case, device)
    result = {"case": name, **case, "dtype": plan.rollout.dtype, "cuda_graphs": plan.rollout.cuda_graphs,
              "compile_backend": plan.rollout.compile_backend,
              "micro_batch_size": plan.rollout.micro_batch_size, "device": torch.cuda.get_device_name(device),
              "torch": torch.__version__, "reasons": {k: v for k, v in plan.reasons.items() if k.startswith("rollout")}}
    tokens = case["batch"] * case["response"]
    for path in ("new",) if skip_old else ("new", "old"):
        engine = _engine(model, plan, case["response"], path)
        # warm-up at full length: the decode step's compile (when planned), graph capture, kernels, allocator
        warm, _ = _timed(engine, batch, case["response"])
        torch.cuda.reset_peak_memory_stats(device)
        full, _ = _timed(engine, batch, case["response"])
        first, _ = _timed(engine, batch, 1)  # prefill and the first token only
        result[path] = {"wall_s": round(full, 3), "tokens_per_s": round(tokens / full, 1),
                        "prefill_s": round(first, 3), "first_call_s": round(warm, 3),
                        "decode_ms_per_step": round(1000 * (full - first) / (case["response"] - 1), 3),
                        "max_memory_allocated_gb": round(torch.cuda.max_memory_allocated(device) / 2**30, 2)}
    if not skip_old:  # the two paths should pick the same greedy tokens (exactly so in float32)
        rows = batch[:min(len(batch), 8)]
        outs = [_timed(_engine(model, plan, GREEDY_CHECK_TOKENS, path, do_sample=False), rows,
                       GREEDY_CHECK_TOKENS)[1].batch["responses"] for path in ("new", "old")]
        result["greedy_tokens_equal"] = f"{int((outs[0] == outs[1]).sum())}/{outs[0].numel()}"
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument("--cases", default="p40,h200")
    parser.add_argument("--skip-old", action="store_true")
    parser.add_argument("--case", help=argparse.SUPPRESS)   # internal: run one case in this process
    parser.add_argument("--json", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        Path(args.json).write_text(json.dumps(run_case(args.case, args.skip_old)))
        return

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for name in args.cases.split(","):
        part = out / f"rollout_speed.{name}.json"
        cmd = [sys.executable, __file__, "--case", name, "--json", str(part)]
        cmd += ["--skip-old"] if args.skip_old else []
        proc = subprocess.run(cmd, timeout=240, capture_output=True, text=True)
        if proc.returncode != 0:
            print(f"{name}: failed (exit {proc.returncode})\n{proc.stderr[-3000:]}")
            results.append({"case": name, "error": proc.stderr[-3000:]})
            continue
        results.append(json.loads(part.read_text()))
    (out / "rollout_speed.json").write_text(json.dumps(results, indent=2))
    print_table(results)
    print(f"wrote {out / 'rollout_speed.json'}")


def print_table(results: list) -> None:
    print("\n| case | shape | dtype | graphs | compiled | path | wall s | tok/s | decode ms/step | prefill s | "
          "first call s | peak GiB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        if "error" in r:
            continue
        shape = f"{r['batch']} x ({r['prompt']} + {r['response']})"
        for path in ("new", "old"):
            if path in r:
                m = r[path]
                graphs = "yes" if r["cuda_graphs"] and path == "new" else "no"
                compiled = r.get("compile_backend") if path == "new" else None
                print(f"| {r['case']} | {shape} | {r['dtype']} | {graphs} | {compiled or 'no'} "
                      f"| {path} | {m['wall_s']} | {m['tokens_per_s']} | {m['decode_ms_per_step']} | {m['prefill_s']} "
                      f"| {m.get('first_call_s')} | {m['max_memory_allocated_gb']} |")
    for r in results:
        if "greedy_tokens_equal" in r:
            print(f"{r['case']}: greedy tokens equal, new vs old path over {GREEDY_CHECK_TOKENS} steps: "
                  f"{r['greedy_tokens_equal']}")
        if "error" in r:
            print(f"{r['case']}: failed, see rollout_speed.json")


if __name__ == "__main__":
    main()
