"""Numeric keys are range-checked when the config is checked (before torch or Ray), naming the key: a
negative learning rate must not reach the worker and fail inside torch."""
import pytest

from verl.trainer.config_check import ConfigError, load_config

BASE = ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=auto", "critic.ppo_micro_batch_size_per_gpu=auto",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=auto",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=auto"]


def test_the_defaults_are_in_range():
    load_config(BASE)


@pytest.mark.parametrize("override, expected", [
    ("actor_rollout_ref.actor.optim.lr=-1e-6", "actor_rollout_ref.actor.optim.lr=-1e-06 is out of range"),
    ("critic.optim.lr=nan", "critic.optim.lr=nan must be a number"),
    ("actor_rollout_ref.actor.clip_ratio=0", "actor_rollout_ref.actor.clip_ratio=0 is out of range: it must be in (0, inf)"),
    ("actor_rollout_ref.actor.clip_ratio_c=0.5", "actor_rollout_ref.actor.clip_ratio_c=0.5 is out of range"),
    ("actor_rollout_ref.actor.kl_loss_coef=-0.1", "actor_rollout_ref.actor.kl_loss_coef=-0.1 is out of range"),
    ("actor_rollout_ref.actor.entropy_coeff=-1", "actor_rollout_ref.actor.entropy_coeff=-1 is out of range"),
    ("algorithm.kl_ctrl.kl_coef=-0.001", "algorithm.kl_ctrl.kl_coef=-0.001 is out of range"),
    ("algorithm.gamma=1.5", "algorithm.gamma=1.5 is out of range: it must be in [0, 1]"),
    ("actor_rollout_ref.rollout.top_p=0", "actor_rollout_ref.rollout.top_p=0 is out of range: it must be in (0, 1]"),
    ("actor_rollout_ref.actor.ppo_epochs=0", "actor_rollout_ref.actor.ppo_epochs=0 must be an integer >= 1"),
    ("actor_rollout_ref.actor.ppo_max_token_len_per_gpu=-5", "ppo_max_token_len_per_gpu=-5 must be an integer >= 1"),
    ("actor_rollout_ref.actor.optim.lr=fast", "actor_rollout_ref.actor.optim.lr='fast' must be a number"),
])
def test_an_out_of_range_number_is_a_config_error_naming_the_key(override, expected):
    with pytest.raises(ConfigError) as caught:
        load_config([*BASE, override])
    assert expected in str(caught.value)


def test_the_command_line_stops_a_negative_lr_before_torch_loads(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    probe = ("import sys, runpy; sys.argv=['main_ppo', *sys.argv[1:]]\n"
             "try:\n    runpy.run_module('verl.trainer.main_ppo', run_name='__main__')\n"
             "finally:\n    print('torch loaded' if 'torch' in sys.modules else 'torch not loaded', file=sys.stderr)\n")
    proc = subprocess.run([sys.executable, "-c", probe, *BASE, "actor_rollout_ref.actor.optim.lr=-1e-6",
                           f"hydra.run.dir={tmp_path}"], cwd=repo, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "actor_rollout_ref.actor.optim.lr=-1e-06 is out of range" in proc.stderr
    assert "torch not loaded" in proc.stderr
