"""compat owns precision: the planner's numerics decisions per role, user values it changes (a
warning naming key, old and new value, or PlanError under strict), and the plan re-issued when
the float16 numerics guard fails at run time (`verl.compat.apply.precision.guard_fallback`)."""
import dataclasses

import pytest
import transformers
from omegaconf import OmegaConf

from verl.compat.apply.apply_plan import resolve_config
from verl.compat.device.catalog import get_profile
from verl.compat.planning.model_spec import ModelSpec
from verl.compat.planning.planner import PlanError, make_plan
from verl.compat.apply.precision import describe, guard_fallback
from verl.compat.device.profile import SoftwareInfo

TINY = ModelSpec.from_hf_config(transformers.Qwen2Config(
    vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
    intermediate_size=128))
SOFTWARE = SoftwareInfo(torch_version="2.11.0", triton_usable=True)
ARR = "actor_rollout_ref"


def _config(**keys):
    """A GRPO + KL-loss config with a critic too (every role present); dotted keys set values."""
    cfg = OmegaConf.create({
        "data": {"train_batch_size": 8, "max_prompt_length": 64, "max_response_length": 64},
        ARR: {"actor": {"ppo_mini_batch_size": 8, "ppo_micro_batch_size_per_gpu": 2, "use_kl_loss": True},
              "rollout": {"log_prob_micro_batch_size_per_gpu": 2},
              "ref": {"log_prob_micro_batch_size_per_gpu": 2}},
        "critic": {"enable": True, "ppo_micro_batch_size_per_gpu": 2},
        "algorithm": {"adv_estimator": "grpo"},
        "trainer": {"n_gpus_per_node": 1, "nnodes": 1},
    })
    for key, value in keys.items():
        OmegaConf.update(cfg, key, value, force_add=True)
    return cfg


def _plan(device: str, **keys):
    return make_plan(get_profile(device), _config(**keys), SOFTWARE, TINY)


# ----------------------------------------------------------------------------- per-role decisions


@pytest.mark.parametrize("device,compute", [("t4", "float16"), ("v100-16gb", "float16"), ("a100-80gb", "bfloat16"),
                                            ("p40", "float32"), ("cpu", "float32")])
def test_each_role_carries_all_its_numerics(device, compute):
    plan = _plan(device)
    fp16 = compute == "float16"
    for name in ("actor", "critic", "ref"):
        role = getattr(plan, name)
        trained = name != "ref"
        assert role.compute_dtype == compute
        assert role.grad_scaler == (fp16 and trained)
        assert role.numerics_guard == fp16 and role.guard_fallback_dtype == ("float32" if fp16 else None)
        assert role.reduce_dtype == "float32"
        # weights: float32 masters when trained or guarded; a frozen bf16/fp32 model in its compute dtype
        assert role.param_dtype == ("float32" if trained or fp16 else compute)
        # FSDP casts on gather only where neither the guard nor the rollout needs float32 weights
        assert role.cast_on_gather == (role.param_dtype != compute and not fp16)
        for key in ("compute_dtype", "param_dtype", "grad_scaler", "numerics_guard", "guard_fallback_dtype",
                    "reduce_dtype", "cast_on_gather"):
            assert plan.reasons[f"{name}.{key}"], (name, key)
    assert plan.rollout.dtype == compute and plan.warnings == []


def test_a_frozen_fp16_reference_keeps_float32_weights_only_under_the_guard():
    guarded = _plan("t4")
    assert (guarded.ref.param_dtype, guarded.ref.compute_dtype, guarded.ref.numerics_guard) == \
        ("float32", "float16", True)
    assert "numerics guard" in guarded.reasons["ref.param_dtype"]
    unguarded = _plan("t4", **{"compat.numerics_guard": False})
    assert (unguarded.ref.param_dtype, unguarded.ref.numerics_guard) == ("float16", False)
    assert unguarded.actor.cast_on_gather and not unguarded.actor.numerics_guard
    assert unguarded.reasons["actor.numerics_guard"] == "compat.numerics_guard=false"


def test_user_float16_weights_get_no_guard():
    plan = _plan("t4", **{f"{ARR}.ref.fsdp_config.model_dtype": "float16"})
    assert plan.ref.param_dtype == "float16" and not plan.ref.numerics_guard
    assert "no float32 copy" in plan.reasons["ref.numerics_guard"]


def test_a_rollout_in_another_dtype_keeps_the_actor_gathering_its_master_weights():
    plan = _plan("a100-80gb", **{f"{ARR}.rollout.dtype": "float32"})
    assert not plan.actor.cast_on_gather and plan.critic.cast_on_gather
    assert "rollout generates in float32" in plan.reasons["actor.cast_on_gather"]


# ----------------------------------------------------------------------------- user values compat changes


def test_a_reduce_dtype_the_device_runs_is_honoured_and_written_back():
    cfg = _config(**{f"{ARR}.actor.fsdp_config.mixed_precision.reduce_dtype": "bfloat16"})
    plan = make_plan(get_profile("a100-80gb"), cfg, SOFTWARE, TINY)
    assert plan.actor.reduce_dtype == "bfloat16" and plan.critic.reduce_dtype == "float32"
    assert plan.warnings == []
    resolve_config(cfg, plan)
    assert cfg[ARR].actor.fsdp_config.mixed_precision.reduce_dtype == "bfloat16"   # no silent rewrite


@pytest.mark.parametrize("key,value,new", [
    (f"{ARR}.actor.fsdp_config.mixed_precision.reduce_dtype", "bfloat16", "float32"),
    (f"{ARR}.actor.fsdp_config.mixed_precision.param_dtype", "bfloat16", "float16"),
    (f"{ARR}.actor.fsdp_config.mixed_precision.buffer_dtype", "bfloat16", "float32"),
    (f"{ARR}.model.attn_implementation", "flash_attention_2", "sdpa"),
])
def test_a_value_compat_changes_is_a_warning_naming_key_old_and_new_or_an_error_under_strict(key, value, new):
    plan = _plan("t4", **{key: value})
    assert any(f"{key}={value}" in w and f"using {new} instead" in w for w in plan.warnings), plan.warnings
    with pytest.raises(PlanError, match=f"{key}={value}.*compat.strict=true"):
        _plan("t4", **{key: value, "compat.strict": True})


def test_offload_on_a_cpu_device_is_planned_off_with_the_reason():
    plan = _plan("cpu", **{f"{ARR}.actor.fsdp_config.param_offload": True})
    assert not plan.actor.param_offload and not plan.actor.optimizer_offload
    assert "host memory already" in plan.reasons["actor.optimizer_offload"]
    assert any(f"{ARR}.actor.fsdp_config.param_offload=True" in w and "using False" in w for w in plan.warnings)
    with pytest.raises(PlanError, match="param_offload=True"):
        _plan("cpu", **{f"{ARR}.actor.fsdp_config.param_offload": True, "compat.strict": True})
    assert _plan("cpu").warnings == []                    # nothing asked, nothing to warn about


# ----------------------------------------------------------------------------- the guard's fallback


def test_a_failed_actor_guard_reissues_actor_ref_and_rollout_in_float32():
    plan = _plan("t4")
    updated, changes = guard_fallback(plan, "actor", "overflow")
    for name in ("actor", "ref"):
        role = getattr(updated, name)
        assert (role.compute_dtype, role.grad_scaler, role.numerics_guard) == ("float32", False, False)
        assert role.param_dtype == "float32"
        assert updated.reasons[f"{name}.compute_dtype"] == "numerics guard: overflow"
    assert updated.rollout.dtype == "float32"
    assert updated.critic == plan.critic                   # its own guard decides for the critic
    assert plan.actor.compute_dtype == "float16"           # pure: the given plan is unchanged
    keys = {c.key for c in changes}
    assert {"actor.compute_dtype", "actor.grad_scaler", "ref.compute_dtype", "rollout.dtype"} <= keys
    line = describe(changes, "overflow")
    assert line.startswith("plan updated: actor.compute_dtype float16 -> float32") and line.endswith(
        "(numerics guard: overflow)")
    assert guard_fallback(updated, "actor", "overflow") == (updated, [])   # applied once


def test_a_failed_critic_guard_changes_only_the_critic():
    plan = _plan("t4")
    updated, changes = guard_fallback(plan, "critic", "overflow")
    assert updated.critic.compute_dtype == "float32" and not updated.critic.grad_scaler
    assert (updated.actor, updated.ref, updated.rollout) == (plan.actor, plan.ref, plan.rollout)
    assert all(c.key.startswith("critic.") for c in changes)


def test_a_role_without_a_guard_is_left_alone():
    plan = _plan("a100-80gb")
    assert guard_fallback(plan, "actor", "x") == (plan, [])
    assert guard_fallback(dataclasses.replace(plan, critic=None), "critic", "x")[1] == []


def test_two_spellings_of_the_compute_dtype_that_disagree_are_named():
    plan = _plan("a100-80gb", **{f"{ARR}.actor.fsdp_config.dtype": "bfloat16",
                                 f"{ARR}.actor.fsdp_config.mixed_precision.param_dtype": "float32"})
    assert plan.actor.compute_dtype == "bfloat16"
    assert any(f"{ARR}.actor.fsdp_config.mixed_precision.param_dtype=float32" in w and "using bfloat16" in w
               for w in plan.warnings)
