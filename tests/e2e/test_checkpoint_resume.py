"""Interrupt and resume `python -m verl.trainer.main_ppo` (CPU, one worker): a run resumed from the
step-2 checkpoint trains steps 3-4 exactly as the uninterrupted run did.

The first run trains 4 steps and saves at steps 2 and 4 (save_freq=2, and the last step). Removing
step 4 and pointing the tracker back at 2 is what a crash during step 3 leaves behind. The data is
shuffled (data.seed) and the resumed run must continue the same epoch order mid-epoch; decoding is
greedy, so generation does not depend on sampling streams. Weights, Adam moments, LR schedule and RNG
are restored bit for bit, so steps 3-4 agree to float32 round-off (rel 1e-5; in practice equal).
"""
import shutil

import pytest
from conftest import run_main_ppo

COMPARED = ("actor/pg_loss", "actor/grad_norm", "actor/entropy", "actor/lr", "critic/vf_loss", "critic/grad_norm",
            "critic/values/mean", "critic/score/mean", "critic/advantages/max", "response_length/mean")


def command(task, checkpoints) -> list[str]:
    model, train, test = task
    return [
        f"data.train_files={train}", f"data.val_files={test}", "data.shuffle=True", "data.seed=3",
        "data.train_batch_size=8", "data.max_prompt_length=48", "data.max_response_length=6",
        "data.dataloader_num_workers=0",
        f"actor_rollout_ref.model.path={model}", "actor_rollout_ref.actor.optim.lr=1e-2",
        "actor_rollout_ref.actor.optim.lr_warmup_steps=3",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.do_sample=False",
        "actor_rollout_ref.rollout.ignore_eos=True", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
        f"critic.model.path={model}", "critic.optim.lr=1e-2", "critic.ppo_micro_batch_size_per_gpu=8",
        "custom_reward_function.path=examples/demo/reward.py",
        "trainer.logger=[console,file]", "trainer.val_before_train=False", "trainer.test_freq=-1",
        "trainer.n_gpus_per_node=1", "trainer.nnodes=1", "trainer.total_epochs=2", "trainer.total_training_steps=4",
        "trainer.save_freq=2", f"trainer.default_local_dir={checkpoints}",
    ]


@pytest.mark.slow
def test_resumed_run_repeats_the_uninterrupted_steps(copy_task, tmp_path):
    checkpoints = tmp_path / "checkpoints"
    proc, full = run_main_ppo(command(copy_task, checkpoints), log_path=tmp_path / "full.jsonl")
    assert proc.returncode == 0
    assert sorted(full) == [1, 2, 3, 4]
    assert (checkpoints / "latest_checkpointed_iteration.txt").read_text() == "4"

    shutil.rmtree(checkpoints / "global_step_4")                     # as if the run died during step 3
    (checkpoints / "latest_checkpointed_iteration.txt").write_text("2")
    proc, resumed = run_main_ppo(command(copy_task, checkpoints), log_path=tmp_path / "resumed.jsonl")
    assert proc.returncode == 0
    assert "Resuming from" in proc.stdout and "global_step_2" in proc.stdout
    assert sorted(resumed) == [3, 4]                                 # continues at step 3, nothing repeated
    for step in (3, 4):
        for key in COMPARED:
            assert resumed[step][key] == pytest.approx(full[step][key], rel=1e-5, abs=1e-7), (step, key)
    assert full[3]["actor/lr"] != full[2]["actor/lr"]                # the LR schedule really moved
    assert (checkpoints / "latest_checkpointed_iteration.txt").read_text() == "4"
