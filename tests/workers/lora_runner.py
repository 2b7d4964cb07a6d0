"""One rank of the two-rank LoRA checkpoint test in test_lora.py (launched as a plain process).

Usage: RANK=.. WORLD_SIZE=.. MASTER_ADDR=.. MASTER_PORT=.. python lora_runner.py MODEL_DIR CKPT_DIR
Trains a LoRA actor (FSDP2 over two gloo ranks: every adapter split between them) one step, saves it as
global_step_1 with the merged Hugging Face weights too, and (rank 0) writes the live model's logits on
fixed token ids next to the checkpoint.
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from test_lora import PROBE, RANK, lora_config, train_step  # noqa: E402
from worker_setup import close_process_group, cpu_plan, ppo_batch  # noqa: E402

from verl.workers.fsdp_workers import ActorRolloutRefWorker  # noqa: E402


def main(model_dir: str, ckpt_dir: str) -> None:
    cfg = lora_config(model_dir)
    cfg.actor.checkpoint = {"save_contents": ["model", "optimizer", "extra", "hf_model"]}
    plan = cpu_plan(model_dir, actor_rollout_ref__model__lora_rank=RANK)
    assert plan.actor.fsdp and plan.ref_in_actor
    worker = ActorRolloutRefWorker(cfg, role="actor_rollout_ref", plan=plan)
    worker.init_model()
    train_step(worker, ppo_batch(batch_size=4))
    worker.save_checkpoint(os.path.join(ckpt_dir, "global_step_1", "actor"), global_step=1)
    with torch.no_grad():
        live = worker.actor_module(input_ids=PROBE).logits
    if int(os.environ.get("RANK", 0)) == 0:
        torch.save(live, os.path.join(ckpt_dir, "live_logits.pt"))


if __name__ == "__main__":
    torch.set_num_threads(1)
    main(sys.argv[1], sys.argv[2])
    close_process_group()
