"""Upstream's Hydra config groups: the group files are current, composing them changes nothing, and a user YAML
that composes ppo_trainer and swaps a group option loads through main_ppo's config path and the config check."""
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from hydra import compose, initialize_config_dir, initialize_config_module
from omegaconf import OmegaConf

from verl.trainer import config_check
from verl.trainer.config import AlgoConfig
from verl.trainer.config.groups import GROUP_FILES, composed, main as write_groups
from verl.utils.config import omega_conf_to_dataclass

REPO = Path(__file__).resolve().parents[2]


def test_group_files_are_current_and_name_the_groups_the_check_allows():
    assert write_groups(["--check"]) == 0
    assert {name.split("/")[0] for name in GROUP_FILES} == set(config_check._CONFIG_GROUPS)


def test_composing_the_groups_gives_the_flat_config():
    with initialize_config_module("verl.trainer.config", version_base=None):
        cfg = compose("ppo_trainer")
    assert OmegaConf.to_container(cfg) == OmegaConf.to_container(composed())
    generated = OmegaConf.load(REPO / "verl/trainer/config/_generated_ppo_trainer.yaml")
    assert OmegaConf.to_container(generated) == OmegaConf.to_container(cfg)


def _user_config(tmp_path: Path) -> Path:
    """A recipe in upstream's style: ppo_trainer from the package, its own rollout option, its own values."""
    (tmp_path / "rollout").mkdir()
    (tmp_path / "rollout" / "sampling.yaml").write_text(textwrap.dedent("""\
        defaults:
          - rollout
          - _self_
        temperature: 0.7
        n: 4
        log_prob_micro_batch_size_per_gpu: 2
        """))
    (tmp_path / "recipe.yaml").write_text(textwrap.dedent("""\
        hydra:
          searchpath:
            - pkg://verl.trainer.config
        defaults:
          - ppo_trainer
          - override rollout@actor_rollout_ref.rollout: sampling
          - _self_
        algorithm:
          adv_estimator: grpo
          kl_ctrl:
            kl_coef: 0.01
        actor_rollout_ref:
          actor:
            ppo_mini_batch_size: 8
            ppo_micro_batch_size_per_gpu: 2
        """))
    return tmp_path


def test_user_yaml_composing_the_groups_passes_the_config_check(tmp_path):
    folder = _user_config(tmp_path)
    with initialize_config_dir(str(folder), version_base=None):
        cfg = compose("recipe", overrides=["trainer.device=cpu"])
    rollout = cfg.actor_rollout_ref.rollout
    assert (rollout.temperature, rollout.n) == (0.7, 4)
    assert rollout.multi_turn.function_tool_path is None  # the rest of the group's option is there
    assert cfg.actor_rollout_ref.actor.ppo_mini_batch_size == 8
    # nothing else moved: only the recipe's keys differ from the packaged config
    base = OmegaConf.to_container(composed())
    base["actor_rollout_ref"]["rollout"].update(temperature=0.7, n=4, log_prob_micro_batch_size_per_gpu=2)
    base["actor_rollout_ref"]["actor"].update(ppo_mini_batch_size=8, ppo_micro_batch_size_per_gpu=2)
    base["algorithm"]["adv_estimator"] = "grpo"
    base["algorithm"]["kl_ctrl"]["kl_coef"] = 0.01
    base["trainer"]["device"] = "cpu"
    assert OmegaConf.to_container(cfg) == base

    config_check.normalize(cfg)
    config_check.validate(cfg)  # raises ConfigError on a problem
    algo = omega_conf_to_dataclass(cfg.algorithm)
    assert isinstance(algo, AlgoConfig)
    assert (algo.adv_estimator, algo.kl_ctrl.kl_coef) == ("grpo", 0.01)


def test_main_ppo_loads_the_user_yaml_and_a_group_override_from_the_command_line(tmp_path):
    folder = _user_config(tmp_path)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    run = subprocess.run([sys.executable, "-m", "verl.trainer.main_ppo", "--config-path", str(folder),
                          "--config-name", "recipe", "--cfg", "job", "actor@actor_rollout_ref.actor=dp_actor",
                          "actor_rollout_ref.rollout.top_p=0.9"],
                         capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    printed = OmegaConf.create(run.stdout)
    assert printed.actor_rollout_ref.rollout.temperature == 0.7
    assert printed.actor_rollout_ref.rollout.top_p == 0.9
    assert printed.algorithm._target_ == "verl.trainer.config.AlgoConfig"


def test_a_group_the_config_does_not_have_is_named():
    try:
        config_check.check_overrides(["optim@actor_rollout_ref.actor.optim=megatron"])
    except config_check.ConfigError as error:
        assert "not one of upstream's config groups" in str(error)
    else:
        raise AssertionError("an unknown group was accepted")

