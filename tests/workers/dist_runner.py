"""One rank of the world-size comparison in test_fsdp_workers.py (launched as a plain process).

Usage: RANK=.. WORLD_SIZE=.. MASTER_ADDR=.. MASTER_PORT=.. python dist_runner.py MODEL_DIR OUT_JSON
Runs compute_log_prob and update_actor on this rank's share of a fixed batch; writes the metrics.
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from worker_setup import actor_rollout_ref_config, close_process_group, cpu_plan, ppo_batch  # noqa: E402

from verl.workers.fsdp_workers import ActorRolloutRefWorker  # noqa: E402


def run(model_dir: str) -> dict:
    torch.set_num_threads(1)
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    config = actor_rollout_ref_config(model_dir, ppo_mini_batch_size=4, ppo_epochs=2, entropy_coeff=0.01)
    worker = ActorRolloutRefWorker(config, role="actor", plan=cpu_plan(model_dir))
    worker.init_model()
    data = ppo_batch(batch_size=8).chunk(world)[rank]
    log_probs = worker.compute_log_prob(data).batch["old_log_probs"]
    data.batch["old_log_probs"] = log_probs
    metrics = worker.update_actor(data).meta_info["metrics"]
    keep = ("actor/pg_loss", "actor/entropy", "actor/grad_norm", "actor/ppo_kl")
    return {"log_probs": log_probs.tolist(), "metrics": {k: metrics[k] for k in keep}}


if __name__ == "__main__":
    result = run(sys.argv[1])
    with open(sys.argv[2], "w") as f:
        json.dump(result, f)
    close_process_group()
