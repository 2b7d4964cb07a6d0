"""One rank of the world-size comparison in test_fsdp_workers.py (launched as a plain process).

Usage: RANK=.. WORLD_SIZE=.. MASTER_ADDR=.. MASTER_PORT=.. python dist_runner.py MODEL_DIR OUT_JSON [dynamic|background]
Runs compute_log_prob and update_actor on this rank's share of a fixed batch; writes the metrics.
`dynamic`: token-budgeted micro-batches, with rows that give the two ranks different micro-batch counts.
`background`: steps under compile_warmup=background until compiled code has run two steps (`run_background`).
"""
import dataclasses
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from worker_setup import actor_rollout_ref_config, close_process_group, cpu_plan, ppo_batch  # noqa: E402

from verl.workers.fsdp_workers import ActorRolloutRefWorker  # noqa: E402


def _short_first_half(data):
    """Rows 0-3 cut to 3 prompt + 2 response tokens, so under a token budget the first rank's rows fit
    several to a micro-batch while the second rank's full-width rows go one at a time."""
    mask = data.batch["attention_mask"]
    mask[:4, :5] = 0
    mask[:4, -4:] = 0
    data.batch["position_ids"] = (mask.cumsum(-1) - 1).clamp(min=0)
    data.batch["response_mask"] = mask[:, -data.batch["responses"].shape[-1]:].clone()
    return data


def run(model_dir: str, dynamic: bool = False) -> dict:
    torch.set_num_threads(1)
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    budget = dict(use_dynamic_bsz=True, ppo_max_token_len_per_gpu=14) if dynamic else {}
    config = actor_rollout_ref_config(model_dir, ppo_mini_batch_size=4, ppo_epochs=2, entropy_coeff=0.01, **budget)
    if dynamic:
        config.rollout.log_prob_use_dynamic_bsz = True
        config.rollout.log_prob_max_token_len_per_gpu = 14
    worker = ActorRolloutRefWorker(config, role="actor", plan=cpu_plan(model_dir))
    worker.init_model()
    data = ppo_batch(batch_size=8)
    data = (_short_first_half(data) if dynamic else data).chunk(world)[rank]
    log_probs = worker.compute_log_prob(data).batch["old_log_probs"]
    data.batch["old_log_probs"] = log_probs
    metrics = worker.update_actor(data).meta_info["metrics"]
    keep = ("actor/pg_loss", "actor/entropy", "actor/grad_norm", "actor/ppo_kl")
    return {"log_probs": log_probs.tolist(), "metrics": {k: metrics[k] for k in keep}}


def run_background(model_dir: str, steps: int | None = None, limit: int = 60) -> dict:
    """Steps (log-probs, then an update) under compile_warmup=background, the layers compiled with torch.compile's
    "eager" backend; `steps` of them, else until compiled code has run for two steps (at most `limit`). Per step:
    this rank's log-probs, its grad norm and whether each pass ran compiled code. `steps` with an unchanged plan
    (nothing compiled) gives the eager reference."""
    from verl.workers.model_building import layer_compile

    torch.set_num_threads(1)
    layer_compile.BACKEND = "eager"
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    plan = cpu_plan(model_dir)
    if steps is None:
        plan = dataclasses.replace(plan, torch_compile=True, compile_warmup="background")
    worker = ActorRolloutRefWorker(actor_rollout_ref_config(model_dir, ppo_mini_batch_size=4), role="actor", plan=plan)
    worker.init_model()
    data = ppo_batch(batch_size=8).chunk(world)[rank]
    out = {"log_probs": [], "grad_norm": [], "compiled": []}
    while len(out["compiled"]) < (steps or limit) and (steps or out["compiled"][-2:] != [[1.0, 1.0]] * 2):
        old = worker.compute_log_prob(data)
        data.batch["old_log_probs"] = old.batch["old_log_probs"]
        metrics = worker.update_actor(data).meta_info["metrics"]
        out["log_probs"].append(old.batch["old_log_probs"].tolist())
        out["grad_norm"].append(metrics["actor/grad_norm"])
        out["compiled"].append([old.meta_info["metrics"].get("perf/compiled_layers/old_log_prob"),
                                metrics.get("perf/compiled_layers/update_actor")])
    return out


if __name__ == "__main__":
    mode = sys.argv[3] if len(sys.argv) > 3 else ""
    result = run_background(sys.argv[1]) if mode == "background" else run(sys.argv[1], dynamic=mode == "dynamic")
    with open(sys.argv[2], "w") as f:
        json.dump(result, f)
    close_process_group()
