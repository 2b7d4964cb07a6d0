"""verl.workers.config / verl.trainer.config: upstream's typed sections built from the composed config, round
trips, read-only fields, unknown keys refused by name, the algorithm's `_target_`, and unsupported backends."""
import dataclasses

import pytest
import torch
from omegaconf import OmegaConf

from verl.trainer.config_check import load_config
from verl.utils.config import omega_conf_to_dataclass


def _contains(typed, plain) -> bool:
    """Every key of `plain` is in `typed` with an equal value (typed sections add `_target_` and upstream keys
    the YAML lacks, e.g. checkpoint.save_lora_only)."""
    if isinstance(plain, dict):
        return isinstance(typed, dict) and all(k in typed and _contains(typed[k], v) for k, v in plain.items())
    return typed == plain


@pytest.fixture(scope="module")
def cfg():
    return load_config(["critic.optim.lr=3e-5", "actor_rollout_ref.actor.policy_loss.loss_mode=gspo",
                        "algorithm.rollout_correction.rollout_is=token"], check=False)


def test_every_role_section_builds_and_round_trips(cfg):
    from verl.workers import config as wc

    sections = [(cfg.actor_rollout_ref.actor, wc.FSDPActorConfig), (cfg.critic, wc.FSDPCriticConfig),
                (cfg.actor_rollout_ref.rollout, wc.RolloutConfig), (cfg.actor_rollout_ref.model, wc.HFModelConfig),
                (cfg.reward, wc.RewardConfig), (cfg.actor_rollout_ref.actor.optim, wc.FSDPOptimizerConfig),
                (cfg.actor_rollout_ref.actor.fsdp_config, wc.FSDPEngineConfig)]
    for section, cls in sections:
        built = omega_conf_to_dataclass(section, cls)
        assert isinstance(built, cls)
        # every key of the section is a field holding the composed value, and the dataclass goes back to it
        plain = OmegaConf.to_container(section, resolve=True)
        back = OmegaConf.to_container(OmegaConf.structured(built), resolve=True)
        assert _contains(back, plain), cls.__name__
    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor, wc.FSDPActorConfig)
    assert isinstance(actor.policy_loss, wc.PolicyLossConfig) and actor.policy_loss.loss_mode == "gspo"
    assert isinstance(actor.optim, wc.FSDPOptimizerConfig) and isinstance(actor.fsdp_config, wc.FSDPEngineConfig)
    assert omega_conf_to_dataclass(cfg.critic, wc.FSDPCriticConfig).optim.lr == 3e-5


def test_fields_are_read_only_unless_upstream_lets_them_change(cfg):
    from dataclasses import FrozenInstanceError

    from verl.workers.config import FSDPActorConfig

    actor = omega_conf_to_dataclass(cfg.actor_rollout_ref.actor, FSDPActorConfig)
    with pytest.raises(FrozenInstanceError):
        actor.clip_ratio = 0.3
    actor.ppo_mini_batch_size = 8    # the worker normalises it per rank, as upstream
    assert actor.ppo_mini_batch_size == 8 and actor["ppo_mini_batch_size"] == 8


def test_unknown_key_is_refused_by_name(cfg):
    from verl.workers.config import FSDPCriticConfig

    section = {**OmegaConf.to_container(cfg.critic, resolve=True), "not_a_key": 1}
    with pytest.raises(Exception, match="not_a_key"):
        omega_conf_to_dataclass(section, FSDPCriticConfig)


def test_algorithm_target_builds_the_typed_algo_config(cfg):
    from verl.trainer.config import AlgoConfig, FilterGroupsConfig, RolloutCorrectionConfig

    assert cfg.algorithm._target_ == "verl.trainer.config.AlgoConfig"
    algo = omega_conf_to_dataclass(cfg.algorithm)
    assert type(algo) is AlgoConfig
    assert isinstance(algo.rollout_correction, RolloutCorrectionConfig) and algo.rollout_correction.rollout_is == "token"
    assert isinstance(algo.filter_groups, FilterGroupsConfig) and algo.filter_groups.enable is False
    assert RolloutCorrectionConfig.disabled().rollout_is is None


def test_unsupported_backends_import_and_say_so():
    from verl.workers import config as wc

    for cls in (wc.McoreActorConfig, wc.McoreEngineConfig, wc.McoreOptimizerConfig, wc.DistillationConfig,
                wc.TrainingWorkerConfig):
        with pytest.raises(NotImplementedError, match="not supported by this verl"):
            cls()
    assert set(wc.__all__) >= {"FSDPActorConfig", "FSDPCriticConfig", "RolloutConfig", "HFModelConfig",
                               "RewardConfig", "FSDPEngineConfig", "FSDPOptimizerConfig", "build_optimizer"}


def test_build_optimizer_reads_the_section():
    from verl.workers.config import FSDPOptimizerConfig, build_optimizer

    layer = torch.nn.Linear(2, 2)
    opt = build_optimizer(layer.parameters(), FSDPOptimizerConfig(lr=0.5, weight_decay=0.1, betas=[0.8, 0.9]))
    group = opt.param_groups[0]
    assert type(opt) is torch.optim.AdamW and group["lr"] == 0.5 and group["betas"] == (0.8, 0.9)
    sgd = FSDPOptimizerConfig(optimizer="SGD", lr=0.1, weight_decay=0.0, override_optimizer_config={"momentum": 0.5})
    assert build_optimizer(layer.parameters(), sgd).param_groups[0]["momentum"] == 0.5
    with pytest.raises(ImportError, match="optimizer_impl"):
        build_optimizer(layer.parameters(), FSDPOptimizerConfig(optimizer_impl="no_such_package.optim"))
    assert dataclasses.is_dataclass(FSDPOptimizerConfig)
