"""One rank of the model-merger round trip in test_model_merger.py (launched as a plain process).

Usage: RANK=.. WORLD_SIZE=.. MASTER_ADDR=.. MASTER_PORT=.. python merge_runner.py MODEL_DIR CKPT_DIR
Trains the actor and the critic one step each, saves both as global_step_1, and (rank 0) writes the
live sharded models' outputs on fixed token ids next to the checkpoint, for the merged folders to match.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from worker_setup import (  # noqa: E402
    actor_rollout_ref_config,
    close_process_group,
    cpu_plan,
    critic_config,
    ppo_batch,
)

from verl.workers.fsdp_workers import ActorRolloutRefWorker, CriticWorker  # noqa: E402

PROBE_IDS = torch.tensor([[5, 17, 33, 2, 41, 9, 12, 50], [7, 7, 21, 3, 30, 44, 1, 19]])


def main(model_dir: str, ckpt_dir: str) -> None:
    rank = int(os.environ.get("RANK", 0))
    data = ppo_batch(batch_size=4)
    actor = ActorRolloutRefWorker(actor_rollout_ref_config(model_dir), role="actor", plan=cpu_plan(model_dir))
    actor.init_model()
    data.batch["old_log_probs"] = actor.compute_log_prob(data).batch["old_log_probs"]
    actor.update_actor(data)
    actor.save_checkpoint(os.path.join(ckpt_dir, "global_step_1", "actor"), global_step=1)

    critic = CriticWorker(critic_config(model_dir), plan=cpu_plan(model_dir))
    critic.init_model()
    data.batch["values"] = critic.compute_values(data).batch["values"]
    critic.update_critic(data)
    critic.save_checkpoint(os.path.join(ckpt_dir, "global_step_1", "critic"), global_step=1)

    with torch.no_grad():
        outputs = {"actor": actor.actor_module(input_ids=PROBE_IDS).logits,
                   "critic": critic.critic_module(input_ids=PROBE_IDS).logits}
    if rank == 0:
        torch.save({"ids": PROBE_IDS, **outputs}, os.path.join(ckpt_dir, "probe.pt"))


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(sys.argv[1], sys.argv[2])
    close_process_group()
