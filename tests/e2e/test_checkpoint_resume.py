"""Interrupt and resume `python -m verl.trainer.main_ppo` (CPU, one worker): a run resumed from the
step-4 checkpoint trains steps 5-6 exactly as the uninterrupted run did.

The first run trains 6 steps and saves at steps 2, 4 and 6 (save_freq=2, and the last step). Then step 6's
model shard is cut in half, as a full disk or a failed copy leaves it: its manifest no longer matches, so
the rerun passes over it (naming the file) and resumes from step 4. 24 shuffled
prompts (data.seed) make 3 batches per epoch, so step 4 is inside the second epoch: the resumed run must
restore that epoch's order (the sampler's RNG state in data.pt) and skip its first batch. Responses are
sampled (temperature 1), so the rollout's sampling generator must be restored too. Weights, Adam moments,
LR schedule and every RNG stream are restored bit for bit, so steps 5-6 repeat exactly (==). Both runs
write the same metrics file: the resumed run appends, and each step keeps exactly one record.
"""
import json

import pytest
from conftest import run_main_ppo

COMPARED = ("actor/pg_loss", "actor/grad_norm", "actor/entropy", "actor/lr", "critic/vf_loss", "critic/grad_norm",
            "critic/values/mean", "critic/score/mean", "critic/advantages/max", "response_length/mean")


def command(task, checkpoints) -> list[str]:
    model, train, test = task
    return [
        f"data.train_files={train}", f"data.val_files={test}", "data.shuffle=True", "data.seed=3",
        "data.train_max_samples=24", "data.train_batch_size=8", "data.max_prompt_length=48", "data.max_response_length=6",
        "data.dataloader_num_workers=0",
        f"actor_rollout_ref.model.path={model}", "actor_rollout_ref.actor.optim.lr=1e-2",
        "actor_rollout_ref.actor.optim.lr_warmup_steps=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.do_sample=True",
        "actor_rollout_ref.rollout.temperature=1.0",
        "actor_rollout_ref.rollout.ignore_eos=True", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
        f"critic.model.path={model}", "critic.optim.lr=1e-2", "critic.ppo_micro_batch_size_per_gpu=8",
        "custom_reward_function.path=examples/demo/reward.py",
        "trainer.logger=[console,file]", "trainer.val_before_train=False", "trainer.test_freq=-1",
        "trainer.n_gpus_per_node=1", "trainer.nnodes=1", "trainer.total_epochs=2", "trainer.total_training_steps=6",
        "trainer.save_freq=2", f"trainer.default_local_dir={checkpoints}",
    ]


@pytest.mark.slow
def test_resumed_run_repeats_the_uninterrupted_steps(copy_task, tmp_path):
    checkpoints = tmp_path / "checkpoints"
    log = tmp_path / "metrics.jsonl"
    proc, full = run_main_ppo(command(copy_task, checkpoints), log_path=log)
    assert proc.returncode == 0
    assert sorted(full) == [1, 2, 3, 4, 5, 6]
    assert (checkpoints / "latest_checkpointed_iteration.txt").read_text() == "6"
    assert (checkpoints / "global_step_6" / "checkpoint_manifest.json").is_file()
    assert not (checkpoints / "run.lock").exists()                   # released at the end of the run
    assert full[1]["timing_s/startup/plan"] > 0 and full[1]["timing_s/startup/inputs"] > 0

    shard = checkpoints / "global_step_6" / "actor" / "model_world_size_1_rank_0.pt"
    with open(shard, "r+b") as f:                                    # the newest checkpoint is damaged
        f.truncate(shard.stat().st_size // 2)
    proc, resumed = run_main_ppo(command(copy_task, checkpoints), log_path=log)
    assert proc.returncode == 0
    assert f"{checkpoints / 'global_step_6'} is damaged ({shard}" in proc.stdout
    assert "Resuming from" in proc.stdout and "global_step_4" in proc.stdout
    assert [json.loads(line)["step"] for line in log.read_text().splitlines()] == [1, 2, 3, 4, 5, 6]
    assert resumed[5]["training/epoch"] == 1
    for step in (1, 2, 3, 4):                                        # the history before the resume is kept
        assert resumed[step] == full[step]
    for step in (5, 6):                                              # sampled, and still bit-identical
        for key in COMPARED:
            assert resumed[step][key] == full[step][key], (step, key)
    assert full[6]["actor/lr"] != full[5]["actor/lr"]                # the LR schedule really moved
    assert (checkpoints / "latest_checkpointed_iteration.txt").read_text() == "6"
