"""Learning through the stock CLI: PPO (GAE + critic) and GRPO train a tiny random Qwen2 from scratch.

Task (examples/demo): the prompt repeats the digit 7; the reward is the fraction of the answer's
characters that are 7 (dense, in [0, 1]). A random model over a ~340-token vocabulary scores ~0.05.
Budget: 30 steps (PPO: 32 prompts/step; GRPO: 16 prompts x 4 samples), about 30-60 s each on 2 cores.
Pass: the first step scores < 0.2 and the mean score of the last 5 steps is >= 0.8.
"""
import pytest
from conftest import run_main_ppo

STEPS = 30


def demo_command(task, log_steps: int = STEPS) -> list[str]:
    model, train, test = task
    return [
        f"data.train_files={train}", f"data.val_files={test}",
        "data.train_batch_size=32", "data.max_prompt_length=48", "data.max_response_length=8",
        "data.dataloader_num_workers=0", "data.seed=1",
        f"actor_rollout_ref.model.path={model}", "actor_rollout_ref.actor.optim.lr=1e-2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=16", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
        "actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=32",
        f"critic.model.path={model}", "critic.optim.lr=1e-2", "critic.ppo_micro_batch_size_per_gpu=16",
        "custom_reward_function.path=examples/demo/reward.py",
        "trainer.logger=[console,file]", "trainer.val_before_train=False", "trainer.test_freq=-1",
        "trainer.n_gpus_per_node=1", "trainer.nnodes=1", "trainer.save_freq=-1",
        "trainer.total_epochs=100", f"trainer.total_training_steps={log_steps}",
    ]


def assert_learns(steps: dict) -> None:
    scores = [steps[s]["critic/score/mean"] for s in sorted(steps)]
    assert len(scores) == STEPS
    assert scores[0] < 0.2, scores
    assert sum(scores[-5:]) / 5 >= 0.8, scores


@pytest.mark.slow
def test_ppo_learns_from_scratch(demo_task, tmp_path):
    proc, steps = run_main_ppo(demo_command(demo_task), log_path=tmp_path / "ppo.jsonl")
    assert proc.returncode == 0
    assert "critic/vf_loss" in steps[1]
    assert_learns(steps)


@pytest.mark.slow
def test_grpo_learns_from_scratch(demo_task, tmp_path):
    overrides = demo_command(demo_task) + [
        "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=4", "data.train_batch_size=16",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8", "actor_rollout_ref.actor.use_kl_loss=True",
    ]
    proc, steps = run_main_ppo(overrides, log_path=tmp_path / "grpo.jsonl")
    assert proc.returncode == 0
    assert "critic/vf_loss" not in steps[1] and "actor/kl_loss" in steps[1]
    assert_learns(steps)
