"""Upstream's PPO quick-start command, unchanged except for paths and CPU-sized batches and lengths.

Upstream's docs/start/quickstart.rst runs (Qwen2.5-0.5B-Instruct on GSM8K, one GPU):

    python3 -m verl.trainer.main_ppo data.train_files=... data.val_files=... data.train_batch_size=256
      data.max_prompt_length=512 data.max_response_length=512 actor_rollout_ref.model.path=...
      actor_rollout_ref.actor.optim.lr=1e-6 actor_rollout_ref.actor.ppo_mini_batch_size=64
      actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 actor_rollout_ref.rollout.name=vllm
      actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8
      actor_rollout_ref.rollout.tensor_model_parallel_size=1 actor_rollout_ref.rollout.gpu_memory_utilization=0.4
      actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4 critic.optim.lr=1e-5 critic.model.path=...
      critic.ppo_micro_batch_size_per_gpu=4 algorithm.kl_ctrl.kl_coef=0.001 trainer.logger=console
      trainer.val_before_train=False trainer.n_gpus_per_node=1 trainer.nnodes=1 trainer.save_freq=10
      trainer.test_freq=10 trainer.total_epochs=15

Here the model is the README's `Qwen/Qwen2.5-0.5B-Instruct` in the PPO test, resolved offline from a
temporary Hugging Face cache holding a tiny locally built Qwen2 under that id (the GRPO test points at
the local folder instead); the data are the parquet files examples/data_preprocess/gsm8k.py
writes from ../shared/data/gsm8k; batches and lengths are CPU-sized, the data sets are subsampled
(data.train_max_samples / val_max_samples), and trainer.total_training_steps=2. Checkpoints (saved at the
last step, as upstream does with save_freq > 0) go to a temporary trainer.default_local_dir.
"""
import json

from conftest import console_metrics, run_main_ppo
from hub_cache import add_to_hub_cache, offline_env

README_MODEL = "Qwen/Qwen2.5-0.5B-Instruct"


def quickstart_command(data, model, checkpoints) -> list[str]:
    return [
        f"data.train_files={data}/train.parquet",
        f"data.val_files={data}/test.parquet",
        "data.train_batch_size=4",
        "data.max_prompt_length=256",
        "data.max_response_length=16",
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
        "actor_rollout_ref.rollout.gpu_memory_utilization=0.4",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
        "critic.optim.lr=1e-5",
        f"critic.model.path={model}",
        "critic.ppo_micro_batch_size_per_gpu=2",
        "algorithm.kl_ctrl.kl_coef=0.001",
        "trainer.logger=console",
        "trainer.val_before_train=False",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        "trainer.save_freq=10",
        "trainer.test_freq=10",
        "trainer.total_epochs=15",
        # CPU sizing
        "trainer.total_training_steps=2",
        "data.train_max_samples=32",
        "data.val_max_samples=4",
        "data.filter_overlong_prompts=True",
        "data.dataloader_num_workers=0",
        f"trainer.default_local_dir={checkpoints}",
    ]


COMMON_METRICS = [
    "critic/score/mean", "critic/rewards/mean", "critic/advantages/mean", "actor/pg_loss", "actor/entropy",
    "actor/ppo_kl", "actor/pg_clipfrac", "response_length/mean", "timing_s/gen", "timing_s/reward",
    "timing_s/old_log_prob", "timing_s/adv", "timing_s/update_actor", "timing_s/step", "perf/throughput",
    "perf/max_memory_allocated_gb", "perf/predicted_peak_gb", "training/global_step",
]


def check_run(proc, expect_critic: bool):
    assert proc.returncode == 0, proc.stderr[-3000:]
    output = proc.stdout + proc.stderr
    assert "verl.compat plan" in output  # the plan is printed at start-up
    assert "rollout.name=vllm is not possible" in output and "using hf instead" in output
    steps = console_metrics(proc.stdout)
    assert sorted(steps) == [1, 2]
    for metric in COMMON_METRICS:
        assert metric in steps[1], metric
    # validation on the last step (test_freq=10 > total_training_steps) as upstream
    assert "val-core/openai/gsm8k/reward/mean@1" in steps[2] and "timing_s/testing" in steps[2]
    for metric in ("critic/vf_loss", "critic/values/mean", "timing_s/values", "timing_s/update_critic"):
        assert (metric in steps[1]) == expect_critic, metric
    # the start-up breakdown (verl/utils/startup/clock.py) rides on the first step's record only
    assert "verl start-up:" in proc.stdout and "timing_s/startup" not in steps[2]
    assert steps[1]["timing_s/startup"] > steps[1]["timing_s/startup/ray_init"] > 0
    for stage in ("config", "plan", "spawn_workers", "init_models", "datasets"):
        assert f"timing_s/startup/{stage}" in steps[1], stage
    actor_role = "actor_rollout" if expect_critic else "actor_rollout_ref"   # the GRPO run has a reference model
    for piece in ("process_start", "actor_load", "ref_load"):
        assert (f"timing_s/startup/{actor_role}/{piece}" in steps[1]) == (piece != "ref_load" or not expect_critic)
    assert ("timing_s/startup/critic/critic_load" in steps[1]) == expect_critic
    return steps


def test_ppo_quickstart_command(gsm8k_data, gsm8k_model, tmp_path):
    """The README's command with its hub model id, from a populated cache, offline."""
    add_to_hub_cache(gsm8k_model, tmp_path / "hf_home", README_MODEL)
    checkpoints = tmp_path / "checkpoints"
    proc, _ = run_main_ppo(quickstart_command(gsm8k_data, README_MODEL, checkpoints),
                           env=offline_env(tmp_path / "hf_home"))
    steps = check_run(proc, expect_critic=True)
    assert (checkpoints / "latest_checkpointed_iteration.txt").read_text() == "2"
    for role in ("actor", "critic"):
        assert (checkpoints / "global_step_2" / role / "model_world_size_1_rank_0.pt").is_file()
    assert "actor/kl_loss" not in steps[1] and "timing_s/ref" not in steps[1]  # no reference model needed
    assert "each holding roles: actor_rollout, critic\n" in proc.stdout


def test_grpo_quickstart_command(gsm8k_data, gsm8k_model, tmp_path):
    """GRPO with KL loss; upstream's `trainer.rollout_data_dir` / `validation_data_dir` write each step's samples
    as <step>.jsonl (prompt and response decoded, ground truth, summed score, step)."""
    overrides = quickstart_command(gsm8k_data, gsm8k_model, tmp_path) + [
        "algorithm.adv_estimator=grpo", "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.actor.use_kl_loss=True",
        f"trainer.rollout_data_dir={tmp_path / 'rollouts'}", f"trainer.validation_data_dir={tmp_path / 'validation'}",
    ]
    proc, _ = run_main_ppo(overrides)
    steps = check_run(proc, expect_critic=False)
    assert "actor/kl_loss" in steps[1] and "timing_s/ref" in steps[1]
    assert "each holding roles: actor_rollout_ref\n" in proc.stdout  # no critic role in the worker processes
    assert sorted(p.name for p in (tmp_path / "rollouts").iterdir()) == ["1.jsonl", "2.jsonl"]
    for step in (1, 2):
        rows = [json.loads(line) for line in (tmp_path / "rollouts" / f"{step}.jsonl").read_text().splitlines()]
        assert len(rows) == 16 and {r["step"] for r in rows} == {step}   # 4 prompts x 4 samples
        assert {"input", "output", "gts", "score"} <= set(rows[0]) and all(r["gts"] for r in rows)
        assert "Let's think step by step" in rows[0]["input"] and rows[0]["input"] == rows[3]["input"]
        mean = sum(r["score"] for r in rows) / len(rows)
        assert abs(mean - steps[step]["critic/score/mean"]) < 1e-3 and "timing_s/dump_rollout_generations" in steps[step]
    [val] = (tmp_path / "validation").iterdir()   # validation runs once, at the last step
    rows = [json.loads(line) for line in val.read_text().splitlines()]
    assert val.name == "2.jsonl" and len(rows) == 4 and {r["step"] for r in rows} == {2}
