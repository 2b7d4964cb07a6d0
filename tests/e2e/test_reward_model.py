"""PPO with a model-based reward through the stock `main_ppo`, with upstream's legacy reward-model keys.

The reward model is a tiny Qwen2ForSequenceClassification whose tokenizer differs from the policy's, so
each rollout is re-templated for it from the prompt's chat messages (data.return_raw_chat=True), as
upstream 0.9.1 does. Without a custom reward function its score is the reward: the trainer's
critic/score/mean (mean summed token-level score) equals the worker's reward_model/score_mean.
"""
import pytest
from conftest import run_main_ppo


@pytest.fixture(scope="module")
def reward_model_dir(tmp_path_factory) -> str:
    from verl.utils.tiny_model import build_tiny_model_dir

    return build_tiny_model_dir(str(tmp_path_factory.mktemp("rm")), seed=3, reward_head=True, hidden_size=32)


def rm_command(task, rm) -> list[str]:
    model, train, test = task
    return [
        f"data.train_files={train}", f"data.val_files={test}", "data.return_raw_chat=True",
        "data.train_batch_size=4", "data.max_prompt_length=48", "data.max_response_length=8",
        "data.dataloader_num_workers=0", "data.train_max_samples=8", "data.val_max_samples=4",
        f"actor_rollout_ref.model.path={model}", "actor_rollout_ref.actor.optim.lr=1e-3",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        f"critic.model.path={model}", "critic.optim.lr=1e-3", "critic.ppo_micro_batch_size_per_gpu=4",
        "reward_model.enable=True", f"reward_model.model.path={rm}",
        "trainer.logger=[console,file]", "trainer.val_before_train=False", "trainer.test_freq=-1",
        "trainer.n_gpus_per_node=1", "trainer.nnodes=1", "trainer.save_freq=-1",
        "trainer.total_epochs=10", "trainer.total_training_steps=2",
    ]


def test_ppo_with_a_reward_model_two_steps(demo_task, reward_model_dir, tmp_path):
    proc, steps = run_main_ppo(rm_command(demo_task, reward_model_dir), log_path=tmp_path / "rm.jsonl")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "\n  rm       float32" in proc.stdout   # the plan's reward-model row
    assert sorted(steps) == [1, 2]
    for step in steps.values():
        assert step["critic/score/mean"] == pytest.approx(step["reward_model/score_mean"], abs=1e-5)
        assert step["critic/score/mean"] != 0.0
        assert "critic/vf_loss" in step and "timing_s/reward" in step


def test_a_reward_model_path_without_a_classification_head_stops_before_training(demo_task, tmp_path):
    model = demo_task[0]
    proc, steps = run_main_ppo(rm_command(demo_task, model), log_path=tmp_path / "bad.jsonl", timeout=180)
    assert proc.returncode != 0 and not steps
    output = proc.stdout + proc.stderr
    assert f"reward_model.model.path={model}: its config.json names ['Qwen2ForCausalLM']" in output
    assert "classification head" in output
