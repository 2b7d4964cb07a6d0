"""Speed of the built-in rollout engine (HFRollout) on the present GPU, each case planned by verl.compat.

Cases on the Qwen2.5-0.5B-shaped model with random weights, each in its own process:
  p40         1 sequence, 256 prompt + 256 new tokens, the simulated P40 plan (float32): decode ms/token
  h200        256 sequences, 512 prompt (256..512 real tokens, left-padded) + 512 new, the device's plan: tokens/s
  h200_eager  the same with torch.compile off (the decode step replayed as a graph, not compiled)
  h200_short  GSM8K-like prompts, 60..200 real tokens padded to 512 (the engine trims common padding first)
Sampling is upstream's default (temperature 1) with ignore_eos, so every row runs to full length.

    python benchmarks/rollout_speed.py --cases p40,h200 --out DIR
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402

CASES = {
    "p40": {"simulate": "p40", "batch": 1, "prompt": 256, "response": 256},
    "h200": {"simulate": None, "batch": 256, "prompt": 512, "response": 512},
    # the same with torch.compile off in the plan: the decode step replayed as a graph but not compiled
    "h200_eager": {"simulate": None, "batch": 256, "prompt": 512, "response": 512, "use_torch_compile": False},
    "h200_short": {"simulate": None, "batch": 256, "prompt": 512, "response": 512, "lengths": (60, 200)},
}
EOS = PAD = 151643  # Qwen's <|endoftext|>; the random model's prompts are random ids below it


def _plan_and_model(case: dict):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from verl.compat import apply_in_process, torch_dtype
    from verl.compat.detect import detect_profile, detect_software
    from verl.compat.model_spec import ModelSpec
    from verl.compat.planner import make_plan

    hf_config = Qwen2Config(**harness.qwen_shape(), eos_token_id=EOS, pad_token_id=PAD)
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


def _engine(model, plan, response):
    from verl.workers.rollout import HFRollout

    cfg = {"temperature": 1.0, "top_k": -1, "top_p": 1.0, "do_sample": True, "response_length": response,
           "seed": 0, "ignore_eos": True}
    return HFRollout(model, cfg, plan=plan)


def _timed(engine, batch, response):
    import torch

    batch.meta_info["response_length"] = response
    torch.cuda.synchronize()
    start = time.perf_counter()
    out = engine.generate_sequences(batch)
    torch.cuda.synchronize()
    return time.perf_counter() - start, out


def run_case(name: str) -> dict:
    import torch

    case = CASES[name]
    plan, model, device = _plan_and_model(case)
    batch = _prompts(case, device)
    engine = _engine(model, plan, case["response"])
    # warm-up at full length: the decode step's compile (when planned), graph capture, kernels, allocator
    warm, _ = _timed(engine, batch, case["response"])
    torch.cuda.reset_peak_memory_stats(device)
    full, _ = _timed(engine, batch, case["response"])
    first, _ = _timed(engine, batch, 1)  # prefill and the first token only
    return {"case": name, **case, "dtype": plan.rollout.dtype, "cuda_graphs": plan.rollout.cuda_graphs,
            "compile_backend": plan.rollout.compile_backend, "micro_batch_size": plan.rollout.micro_batch_size,
            "device": torch.cuda.get_device_name(device), "wall_s": round(full, 3),
            "tokens_per_s": round(case["batch"] * case["response"] / full, 1), "prefill_s": round(first, 3),
            "first_call_s": round(warm, 3), "decode_ms_per_step": round(1000 * (full - first) / (case["response"] - 1), 3),
            "max_memory_allocated_gb": round(torch.cuda.max_memory_allocated(device) / 2**30, 2)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="rollout_out")
    ap.add_argument("--cases", default="p40,h200", help=f"comma-separated: {', '.join(CASES)}")
    ap.add_argument("--case", help=argparse.SUPPRESS)   # internal: run one case in this process
    ap.add_argument("--json", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.case:
        Path(args.json).write_text(json.dumps(run_case(args.case)))
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for name in args.cases.split(","):
        part = out / f"rollout_speed.{name}.json"
        proc = subprocess.run([sys.executable, __file__, "--case", name, "--json", str(part)], timeout=240,
                              capture_output=True, text=True, env=harness.env())
        results.append(json.loads(part.read_text()) if proc.returncode == 0 else
                       {"case": name, "error": f"exit {proc.returncode}: {proc.stderr[-3000:]}"})
    (out / "rollout_speed.json").write_text(json.dumps(results, indent=1))
    keys = ("case", "batch", "prompt", "response", "dtype", "cuda_graphs", "compile_backend", "wall_s", "tokens_per_s",
            "decode_ms_per_step", "prefill_s", "first_call_s", "max_memory_allocated_gb")
    print("| " + " | ".join(keys) + " |\n|" + "---|" * len(keys))
    for r in results:
        print("| " + " | ".join(str(r.get(k, r.get("error", "")[:80] if k == "wall_s" else "")) for k in keys) + " |")
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
