"""The SFT run's plan: the trained model planned as an actor, from upstream's SFT keys."""
import pytest
from test_planner import FULL, PLAIN, QWEN05

from verl.compat.device.catalog import get_profile
from verl.compat.planning.sft import make_sft_plan, ppo_view


def sft_config(**data):
    return {"model": {"path": "/m", "attn_implementation": "auto", "use_remove_padding": "auto",
                      "enable_gradient_checkpointing": "auto"},
            "engine": {"dtype": "auto", "model_dtype": "auto", "param_offload": "auto", "optimizer_offload": "auto"},
            "data": {"train_batch_size": 64, "micro_batch_size_per_gpu": 4, "use_dynamic_bsz": False,
                     "max_length": 1024, **data},
            "trainer": {"n_gpus_per_node": 1, "nnodes": 1}}


def test_view_maps_the_sft_keys_onto_the_actor():
    view = ppo_view(sft_config())
    actor = view["actor_rollout_ref"]["actor"]
    assert view["actor_rollout_ref"]["model"]["path"] == "/m"
    assert (actor["ppo_mini_batch_size"], actor["ppo_micro_batch_size_per_gpu"]) == (64, 4)
    assert view["data"]["max_prompt_length"] == 1 and view["data"]["max_response_length"] == 1023   # every token scored
    assert view["algorithm"]["adv_estimator"] == "grpo"


def test_dtypes_follow_the_device_and_only_the_actor_is_planned():
    for device, compute, guard in (("cpu", "float32", False), ("t4", "float16", True), ("h200", "bfloat16", False)):
        plan = make_sft_plan(get_profile(device), sft_config(), PLAIN, QWEN05)
        assert (plan.actor.compute_dtype, plan.actor.param_dtype, plan.actor.numerics_guard) == \
            (compute, "float32", guard)
        assert plan.critic is None and plan.ref is None and plan.reward_model is None
        assert plan.actor.micro_batch_size_per_gpu == 4


def test_packing_is_planned_off_and_user_dtype_is_kept():
    plan = make_sft_plan(get_profile("h200"), sft_config(), FULL, QWEN05)
    assert plan.actor.attn_implementation == "flash_attention_2" and not plan.actor.use_remove_padding
    assert "padded" in plan.reasons["actor.use_remove_padding"]
    cfg = sft_config()
    cfg["engine"]["dtype"] = "float32"
    assert make_sft_plan(get_profile("h200"), cfg, FULL, QWEN05).actor.compute_dtype == "float32"


def test_sft_generates_nothing_so_its_peak_is_the_update():
    """SFT plans printed a generation peak (the H200 run under the p40 profile: 19.26 GiB "in validation",
    above its 18.36 GiB update; here 14.18 over 11.95): SFT samples nothing, so its plan has no generation
    phase or engine settings."""
    from verl.compat import format_plan

    plan = make_sft_plan(get_profile("h200"), sft_config(train_batch_size=32, max_length=512), FULL, QWEN05)
    phases = plan.memory["phases"]
    assert "rollout" not in phases and "validation" not in phases and not plan.generates
    assert plan.memory["peak_phase"] == "actor_update" and plan.predicted_peak_gb == pytest.approx(11.95, abs=0.01)
    assert plan.predicted_peak_gb == plan.memory["phases_total"]["actor_update"]["total_gb"] == plan.actor.predicted_peak_gb
    # the no-grad forward (SFT's validation loss) is planned, and below the update here
    assert phases["log_prob"] and plan.memory["phases_total"]["log_prob"]["total_gb"] < plan.predicted_peak_gb
    text = format_plan(plan)
    assert "\n  rollout " not in text and "rollout." not in text and "in actor_update;" in text
    assert not [k for k in plan.reasons if k.startswith("rollout.")]


def test_a_ppo_plan_still_generates():
    from test_planner import QUICKSTART

    from verl.compat import format_plan
    from verl.compat.planning.planner import make_plan

    plan = make_plan(get_profile("p40"), QUICKSTART, FULL, QWEN05)
    assert plan.generates and {"rollout", "validation"} <= set(plan.memory["phases"])
    assert "\n  rollout  hf " in format_plan(plan) and "rollout.micro_batch_size" in plan.reasons
