"""One rank of the world-size comparison in test_fsdp_workers.py (launched as a plain process).

Usage: RANK=.. WORLD_SIZE=.. MASTER_ADDR=.. MASTER_PORT=.. python dist_runner.py MODEL_DIR OUT_JSON [dynamic]
Runs compute_log_prob and update_actor on this rank's share of a fixed batch; writes the metrics.
`dynamic`: token-budgeted micro-batches, with rows that give the two ranks different micro-batch counts.
"""
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


if __name__ == "__main__":
    result = run(sys.argv[1], dynamic=len(sys.argv) > 3 and sys.argv[3] == "dynamic")
    with open(sys.argv[2], "w") as f:
        json.dump(result, f)
    close_process_group()
