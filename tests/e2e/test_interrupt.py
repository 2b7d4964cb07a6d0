"""Ctrl-C (SIGINT) on a running `main_ppo`: the run ends with one line naming the last complete checkpoint
and how to resume, and no Python/Ray traceback. Every wait has a deadline. (SIGTERM and the no-checkpoint
line: tests/trainer/test_interruption.py.)"""
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from conftest import REPO_ROOT


def command(task, checkpoints, save_freq):
    model, train, test = task
    return [sys.executable, "-m", "verl.trainer.main_ppo",
            f"data.train_files={train}", f"data.val_files={test}", "data.train_batch_size=4",
            "data.max_prompt_length=48", "data.max_response_length=4", "data.dataloader_num_workers=0",
            "data.val_max_samples=4", f"actor_rollout_ref.model.path={model}", f"critic.model.path={model}",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
            "actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
            "critic.ppo_micro_batch_size_per_gpu=4", "custom_reward_function.path=examples/demo/reward.py",
            "trainer.logger=[console]", "trainer.val_before_train=False", "trainer.test_freq=-1",
            "trainer.n_gpus_per_node=1", "trainer.nnodes=1", "trainer.total_training_steps=1000",
            f"trainer.save_freq={save_freq}", f"trainer.default_local_dir={checkpoints}"]


def interrupt_after(argv, marker: str, signum: int, timeout: float = 240):
    """Start main_ppo, send `signum` once stdout shows `marker`; return (returncode, stdout, stderr)."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONUNBUFFERED"] = "1"
    proc = subprocess.Popen(argv, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    out, err = [], []
    seen = threading.Event()

    def read_stdout():
        for line in proc.stdout:
            out.append(line)
            if marker in line:
                seen.set()

    readers = [threading.Thread(target=read_stdout, daemon=True),
               threading.Thread(target=lambda: err.extend(proc.stderr), daemon=True)]
    for reader in readers:
        reader.start()
    try:
        deadline = time.monotonic() + timeout
        while not seen.wait(1.0):
            assert proc.poll() is None, "".join(err)[-3000:]
            assert time.monotonic() < deadline, f"{marker!r} never appeared"
        proc.send_signal(signum)
        proc.wait(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    for reader in readers:
        reader.join(timeout=10)
    return proc.returncode, "".join(out), "".join(err)


@pytest.mark.slow
def test_ctrl_c_names_the_last_checkpoint_and_how_to_resume(demo_task, tmp_path):
    checkpoints = tmp_path / "ckpt"
    code, out, err = interrupt_after(command(demo_task, checkpoints, save_freq=1), "Saved checkpoint", signal.SIGINT)
    assert code == 128 + signal.SIGINT, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("verl: stopped by Ctrl-C; last complete checkpoint: ") and str(checkpoints) in last
    assert "global_step_" in last and "run the same command again" in last
    assert "Traceback" not in err and "Traceback" not in out

