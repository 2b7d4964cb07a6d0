"""LoRA through the stock CLI: `main_ppo` GRPO with `actor_rollout_ref.model.lora_rank=8` for 2 steps on CPU.

The KL loss needs a reference policy, which the LoRA actor serves with its adapters disabled (no second
model). The step-2 checkpoint shows what trained: every frozen weight equals the starting model's, the
adapters moved; the stock merger turns it into a Hugging Face folder plus the peft adapter folder.
"""
import pytest
import torch
from conftest import run_main_ppo

pytest.importorskip("peft", reason="LoRA needs peft (pip install 'verl[peft]')")


def test_grpo_lora_trains_only_the_adapters(demo_task, tmp_path):
    model, train, test = demo_task
    checkpoints = tmp_path / "checkpoints"
    proc, steps = run_main_ppo([
        f"data.train_files={train}", f"data.val_files={test}", "data.train_batch_size=8",
        "data.max_prompt_length=48", "data.max_response_length=6", "data.dataloader_num_workers=0",
        f"actor_rollout_ref.model.path={model}", "actor_rollout_ref.model.lora_rank=8",
        "actor_rollout_ref.model.lora_alpha=16", "actor_rollout_ref.actor.optim.lr=1e-2",
        "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.use_kl_loss=True",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
        "actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=32",
        "custom_reward_function.path=examples/demo/reward.py",
        "trainer.logger=[console,file]", "trainer.val_before_train=False", "trainer.test_freq=-1",
        "trainer.n_gpus_per_node=1", "trainer.nnodes=1", "trainer.total_epochs=1", "trainer.total_training_steps=2",
        "trainer.save_freq=2", f"trainer.default_local_dir={checkpoints}",
    ], log_path=tmp_path / "metrics.jsonl")
    assert proc.returncode == 0
    assert sorted(steps) == [1, 2] and "actor/kl_loss" in steps[2]
    assert "ref_in_actor" in proc.stdout   # the printed plan says where the reference comes from

    from transformers import AutoModelForCausalLM

    start = AutoModelForCausalLM.from_pretrained(model).state_dict()
    actor = checkpoints / "global_step_2" / "actor"
    shard = torch.load(actor / "model_world_size_1_rank_0.pt")
    frozen = {k: v for k, v in shard.items() if ".lora_" not in k}
    adapters = {k: v for k, v in shard.items() if ".lora_B." in k}
    assert len(frozen) >= len(start) - 1 and adapters   # lm_head may be tied to the embedding
    for key, value in frozen.items():
        name = key.removeprefix("base_model.model.").replace(".base_layer.", ".")
        assert torch.equal(value, start[name]), key
    assert any(v.abs().max() > 0 for v in adapters.values())   # B starts at zero: the adapters trained

    from verl.model_merger.__main__ import main as merger_main   # the stock command, in this process

    target = tmp_path / "merged"
    assert merger_main(["merge", "--backend", "fsdp", "--local_dir", str(actor), "--target_dir", str(target)]) == 0
    assert (target / "model.safetensors").is_file() and (target / "lora_adapter" / "adapter_config.json").is_file()
