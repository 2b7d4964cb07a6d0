"""Each consistency rule of config_check.validate, on the upstream quick start with one thing changed."""
import pytest
from omegaconf import OmegaConf
from test_config import (  # tests/trainer is on sys.path (pytest rootdir-less import)
    GRPO_GSM8K,
    QUICKSTART_PPO,
)

from verl.trainer.config_check import (
    ADV_ESTIMATORS,
    POLICY_LOSS_MODES,
    KL_ESTIMATORS,
    LOSS_AGG_MODES,
    ConfigError,
    load_config,
    validate,
)


@pytest.fixture(scope="module")
def ppo():
    return load_config(QUICKSTART_PPO)


@pytest.fixture(scope="module")
def grpo():
    return load_config(GRPO_GSM8K)


def changed(base, *dotlist):
    """`base` with the dotted overrides applied (values parsed as YAML, like Hydra does)."""
    cfg = OmegaConf.merge(base, OmegaConf.from_dotlist(list(dotlist)))
    OmegaConf.set_struct(cfg, True)
    return cfg


def errors_of(cfg) -> str:
    with pytest.raises(ConfigError) as info:
        validate(cfg)
    return str(info.value)


def test_upstream_commands_pass(ppo, grpo):
    assert validate(ppo) == []
    assert validate(grpo) == []


def test_mini_batch_larger_than_train_batch(ppo):
    msg = errors_of(changed(ppo, "actor_rollout_ref.actor.ppo_mini_batch_size=512"))
    assert "actor_rollout_ref.actor.ppo_mini_batch_size=512 is larger than data.train_batch_size=256" in msg
    assert "at most 256" in msg


def test_mini_batch_must_divide_train_batch(ppo):
    msg = errors_of(changed(ppo, "actor_rollout_ref.actor.ppo_mini_batch_size=48"))
    assert "not a multiple of actor_rollout_ref.actor.ppo_mini_batch_size=48" in msg
    assert "e.g. 32" in msg  # largest divisor of 256 not above 48


def test_critic_mini_batch_checked_when_critic_is_used(ppo):
    msg = errors_of(changed(ppo, "critic.ppo_mini_batch_size=300"))
    assert "critic.ppo_mini_batch_size=300 is larger than data.train_batch_size=256" in msg


def test_both_micro_batch_settings(ppo):
    msg = errors_of(changed(ppo, "actor_rollout_ref.actor.ppo_micro_batch_size=8"))
    assert "Remove actor_rollout_ref.actor.ppo_micro_batch_size (deprecated" in msg


def test_neither_micro_batch_setting(ppo):
    msg = errors_of(changed(ppo, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=null"))
    assert "Set actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=<int>" in msg


def test_deprecated_global_micro_batch_alone_is_accepted(ppo):
    cfg = changed(ppo, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=null",
                  "actor_rollout_ref.actor.ppo_micro_batch_size=4",
                  "critic.ppo_micro_batch_size_per_gpu=null", "critic.ppo_micro_batch_size=4")
    assert validate(cfg) == []


def test_critic_per_gpu_default_follows_deprecated_key_without_counting_as_both(ppo):
    # upstream's critic.ppo_micro_batch_size_per_gpu defaults to an interpolation of the global key
    base = load_config([a for a in QUICKSTART_PPO if not a.startswith("critic.ppo_micro")], check=False)
    cfg = changed(base, "critic.ppo_micro_batch_size=4")
    assert cfg.critic.ppo_micro_batch_size_per_gpu == 4
    assert validate(cfg) == []


def test_deprecated_global_micro_batch_below_device_count(ppo):
    cfg = changed(ppo, "trainer.n_gpus_per_node=8", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=null",
                  "actor_rollout_ref.actor.ppo_micro_batch_size=4")
    assert "ppo_micro_batch_size=4 is below the 8 devices" in errors_of(cfg)


def test_micro_batch_must_be_positive_int(ppo):
    msg = errors_of(changed(ppo, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=0"))
    assert "must be a positive integer or auto" in msg


def test_auto_micro_batch_is_legal(ppo):
    assert validate(changed(ppo, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=auto")) == []


def test_train_batch_times_n_must_divide_over_devices(grpo):
    msg = errors_of(changed(grpo, "data.train_batch_size=1027", "actor_rollout_ref.actor.ppo_mini_batch_size=1027"))
    assert "1027 × 5 = 5135 responses per step must divide evenly" in msg
    assert "8 devices" in msg and "multiple of 8" in msg


def test_mini_batch_times_n_must_divide_over_devices(grpo):
    base = changed(grpo, "trainer.n_gpus_per_node=3", "data.train_batch_size=1020",
                   "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1")
    msg = errors_of(changed(base, "actor_rollout_ref.actor.ppo_mini_batch_size=340"))
    assert "ppo_mini_batch_size × rollout.n = 340 × 5 = 1700 must divide evenly over 3 devices" in msg
    assert validate(changed(base, "actor_rollout_ref.actor.ppo_mini_batch_size=255")) == []


def test_per_device_mini_batch_must_be_a_multiple_of_micro_batch(grpo):
    # 256 prompts × 5 responses / 8 devices = 160 per device, not a multiple of 48
    msg = errors_of(changed(grpo, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=48"))
    assert "Each device gets 160 responses per actor mini-batch" in msg
    assert "ppo_micro_batch_size_per_gpu=48" in msg


def test_dynamic_batch_size_needs_no_micro_batches(ppo):
    cfg = changed(ppo, "actor_rollout_ref.actor.use_dynamic_bsz=true",
                  "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=null",
                  "critic.ppo_micro_batch_size_per_gpu=null",
                  "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=null")
    assert validate(cfg) == []


def test_ref_micro_batch_required_only_with_a_reference_policy(ppo):
    cfg = changed(ppo, "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=null")
    assert validate(cfg) == []
    msg = errors_of(changed(cfg, "algorithm.use_kl_in_reward=true"))
    assert "Set actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=<int>" in msg


def test_rollout_log_prob_micro_batch_required(ppo):
    msg = errors_of(changed(ppo, "actor_rollout_ref.rollout.log_prob_micro_batch_size=8"))
    assert "Remove actor_rollout_ref.rollout.log_prob_micro_batch_size" in msg


def test_grpo_needs_no_critic_settings(grpo):
    assert validate(changed(grpo, "critic.ppo_mini_batch_size=99999")) == []


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_every_loss_agg_mode_is_accepted(ppo, mode):
    assert validate(changed(ppo, f"actor_rollout_ref.actor.loss_agg_mode={mode}")) == []


def test_unknown_loss_agg_mode(ppo):
    msg = errors_of(changed(ppo, "actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-summ"))
    assert "loss_agg_mode='seq-mean-token-summ' is not one of" in msg
    assert "Did you mean seq-mean-token-sum?" in msg


def test_unknown_adv_estimator(ppo):
    assert "Did you mean grpo?" in errors_of(changed(ppo, "algorithm.adv_estimator=gpro"))


def test_upstream_only_adv_estimator_says_not_implemented(ppo):
    assert "does not implement" in errors_of(changed(ppo, "algorithm.adv_estimator=optimal_token_baseline"))


def test_gdpo_needs_its_reward_keys(ppo):
    assert "needs algorithm.gdpo_reward_keys" in errors_of(changed(ppo, "algorithm.adv_estimator=gdpo"))
    assert validate(changed(ppo, "algorithm.adv_estimator=gdpo", "algorithm.gdpo_reward_keys=[a,b]")) == []


def test_adv_estimator_list_matches_core_algos():
    core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
    assert set(ADV_ESTIMATORS) == set(core_algos.ADV_ESTIMATOR_REGISTRY)


def test_policy_loss_modes_match_core_algos_and_unknown_ones_are_refused(ppo):
    core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
    assert set(POLICY_LOSS_MODES) == set(core_algos.POLICY_LOSS_REGISTRY)
    assert validate(changed(ppo, "actor_rollout_ref.actor.policy_loss.loss_mode=gspo")) == []
    assert validate(changed(ppo, "actor_rollout_ref.actor.policy_loss.loss_mode=dro",
                            "actor_rollout_ref.actor.policy_loss.dro_beta=0.1")) == []
    assert "needs a positive dro_beta" in errors_of(changed(ppo, "actor_rollout_ref.actor.policy_loss.loss_mode=dro"))
    assert "does not implement" in errors_of(changed(ppo, "actor_rollout_ref.actor.policy_loss.loss_mode=bypass_mode"))
    assert "Did you mean cispo?" in errors_of(changed(ppo, "actor_rollout_ref.actor.policy_loss.loss_mode=cisp"))


def test_grpo_passk_needs_two_responses_per_prompt(grpo):
    msg = errors_of(changed(grpo, "algorithm.adv_estimator=grpo_passk", "actor_rollout_ref.rollout.n=1",
                            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4"))
    assert "needs actor_rollout_ref.rollout.n >= 2" in msg


def test_kl_estimators(ppo):
    assert validate(changed(ppo, "actor_rollout_ref.actor.kl_loss_type=k3+", "algorithm.kl_penalty=k1")) == []
    assert validate(changed(ppo, "actor_rollout_ref.actor.kl_loss_type=low_var_kl+",
                            "algorithm.kl_penalty=kl+")) == []
    assert "is not a KL estimator" in errors_of(changed(ppo, "algorithm.kl_penalty=kl3"))
    assert "Did you mean k3+?" in errors_of(changed(ppo, "actor_rollout_ref.actor.kl_loss_type=k3++"))


def test_kl_estimator_list_matches_core_algos():
    """Every name the check lets through is one core_algos.kl_penalty computes, and vice versa."""
    core_algos = pytest.importorskip("verl.trainer.ppo.core_algos")
    torch = pytest.importorskip("torch")
    assert set(KL_ESTIMATORS) == {name + plus for name in core_algos.KL_ESTIMATORS for plus in ("", "+")}
    logprob, ref = torch.tensor([-1.0, -0.5]), torch.tensor([-0.8, -0.9])
    for name in KL_ESTIMATORS:
        assert torch.isfinite(core_algos.kl_penalty(logprob, ref, name)).all(), name
    with pytest.raises(ValueError, match="unsupported KL estimator"):
        core_algos.kl_penalty(logprob, ref, "full")


def test_kl_twice_warns(ppo):
    warnings = validate(changed(ppo, "algorithm.use_kl_in_reward=true", "actor_rollout_ref.actor.use_kl_loss=true"))
    assert any("penalised twice" in w for w in warnings)


def test_grpo_with_one_sample_per_prompt_warns(grpo):
    warnings = validate(changed(grpo, "actor_rollout_ref.rollout.n=1",
                                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4"))
    assert any("every advantage is 0" in w for w in warnings)


def test_hardware_keys_accept_auto_and_concrete_values(ppo):
    cfg = changed(ppo, "actor_rollout_ref.actor.fsdp_config.param_offload=true",
                  "actor_rollout_ref.actor.fsdp_config.model_dtype=fp32",
                  "actor_rollout_ref.actor.fsdp_config.mixed_precision.param_dtype=float16",
                  "actor_rollout_ref.rollout.dtype=float16", "actor_rollout_ref.rollout.name=hf",
                  "actor_rollout_ref.model.attn_implementation=sdpa", "trainer.device=cpu",
                  "actor_rollout_ref.rollout.gpu_memory_utilization=auto")
    assert validate(cfg) == []


@pytest.mark.parametrize("override, fragment", [
    ("actor_rollout_ref.actor.fsdp_config.param_offload=maybe", "must be true, false or auto"),
    ("actor_rollout_ref.rollout.gpu_memory_utilization=1.5", "must be in (0, 1] or auto"),
    ("actor_rollout_ref.rollout.name=sglan", "Did you mean sglang?"),
    ("actor_rollout_ref.rollout.name=vlm", "Did you mean vllm?"),
    ("trainer.device=tpu", "trainer.device='tpu' is not one of"),
    ("compat.memory_margin=1.5", "compat.memory_margin=1.5 must be a fraction"),
    ("compat.always_fsdp=sometimes", "compat.always_fsdp='sometimes' must be true or false"),
    ("compat.compile_warmup=later", "compat.compile_warmup='later' is not one of auto, background, synchronous, off"),
    ("data.truncation=cut", "data.truncation='cut' is not one of"),
    ("actor_rollout_ref.actor.strategy=megatron", "FSDP only"),
])
def test_bad_values_say_what_is_allowed(ppo, override, fragment):
    assert fragment in errors_of(changed(ppo, override))


@pytest.mark.parametrize("engine", ["sglang", "trtllm"])
def test_upstream_engine_names_pass_to_the_planner(grpo, engine):
    """An upstream script's `rollout.name=sglang` (here with its async mode and hermes multi-turn format) passes
    the config check: the planner replaces the engine by one this verl ships and warns
    (tests/compat/test_planner.py::test_an_unknown_engine_is_adapted_naming_the_engines_this_verl_ships)."""
    cfg = changed(grpo, f"actor_rollout_ref.rollout.name={engine}", "actor_rollout_ref.rollout.mode=async",
                  "actor_rollout_ref.rollout.multi_turn.format=hermes")
    assert validate(cfg) == []


def test_upstream_keys_this_trainer_does_not_apply_are_said(ppo):
    """Rollout correction, over-sampling and logger tables exist in this config tree (upstream's trainer reads them)
    but this trainer does not apply them: a changed value is a start-up warning naming the key, defaults are silent."""
    warnings = validate(changed(ppo, "algorithm.rollout_correction.rollout_is=token", "trainer.log_val_generations=10",
                                "algorithm.rollout_correction.bypass_mode=true"))
    said = [w.split("=")[0] for w in warnings if "has no effect here" in w]
    assert said == ["algorithm.rollout_correction.rollout_is", "algorithm.rollout_correction.bypass_mode",
                    "trainer.log_val_generations"]
    assert not [w for w in validate(ppo) if "has no effect here" in w]


def test_sampling_validation_needs_temperature(ppo):
    msg = errors_of(changed(ppo, "actor_rollout_ref.rollout.val_kwargs.do_sample=true"))
    assert "val_kwargs.temperature > 0" in msg


def test_unimplemented_feature_switch_is_an_error(ppo):
    assert "Megatron's LoRA" in errors_of(changed(ppo, "actor_rollout_ref.model.lora.rank=8"))
    assert "does not implement" in errors_of(changed(ppo, "distillation.enabled=true"))


def test_changed_inert_upstream_key_warns(ppo):
    warnings = validate(changed(ppo, "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=512"))
    assert any("has no effect here" in w and "update_weights_bucket_megabytes" in w for w in warnings)


def test_every_problem_is_reported_at_once(ppo):
    msg = errors_of(changed(ppo, "actor_rollout_ref.actor.loss_agg_mode=x", "algorithm.adv_estimator=y"))
    assert msg.count("\n- ") == 1 and "loss_agg_mode" in msg and "adv_estimator" in msg


def test_upstream_attention_spelling_becomes_the_explicit_choice():
    upstream_way = "+actor_rollout_ref.model.override_config.attn_implementation=eager"
    assert load_config(QUICKSTART_PPO + [upstream_way]).actor_rollout_ref.model.attn_implementation == "eager"
    with pytest.raises(ConfigError, match="disagree"):
        load_config(QUICKSTART_PPO + [upstream_way, "actor_rollout_ref.model.attn_implementation=sdpa"])
