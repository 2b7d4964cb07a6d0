"""The reward model in the memory model: its pass (weights, embeddings, one layer, hidden states, a 1-wide
score; no vocabulary logits), its weights resident elsewhere unless offloaded, and the planner fitting its
offload and micro-batch from it."""
from dataclasses import replace

import pytest
import transformers
from test_planner import PLAIN, QWEN05, config

from verl.compat import format_plan
from verl.compat.device.catalog import get_profile
from verl.compat.planning.decider import MemoryShortfall
from verl.compat.planning.memory import (BYTES, GiB, Workload, estimate_memory, layer_forward_bytes,
                                         reward_model_forward, reward_model_params)
from verl.compat.planning.model_spec import ModelSpec
from verl.compat.planning.planner import make_plan

RM = {"reward__reward_model__enable": True, "reward__reward_model__model_path": "/rm"}
ROWS, SEQ = 32, 768


def rm_plan(device="h200", n=1, **extra):
    cfg = config(32, 512, 256, 32, 32, 32, actor_rollout_ref__rollout__n=n, **{**RM, **extra})
    return make_plan(get_profile(device), cfg, PLAIN, QWEN05, reward_model=QWEN05)


def test_params_are_the_trunk_and_a_one_wide_head():
    assert reward_model_params(QWEN05) == QWEN05.num_params - QWEN05.lm_head_params + QWEN05.hidden_size


def test_forward_is_one_layer_beside_the_embeddings_and_has_no_vocabulary_term():
    plan = rm_plan().reward_model    # bfloat16 weights and compute
    terms = reward_model_forward(QWEN05, plan, ROWS, SEQ)
    tokens = ROWS * SEQ
    layer = tokens * layer_forward_bytes(QWEN05, "bfloat16", "bfloat16", plan.attn_implementation, SEQ)
    assert terms == {"inputs_embeds": tokens * QWEN05.hidden_size * 2, "activations (1 layer)": layer,
                     "reward_model.compute_copy": 0.0}
    assert not any("logit" in k for k in terms)


def test_float32_weights_under_float16_add_one_cast_and_the_guards_float32_pass():
    plan = rm_plan("t4").reward_model
    assert (plan.param_dtype, plan.compute_dtype, plan.numerics_guard) == ("float32", "float16", True)
    tokens = ROWS * SEQ
    unguarded = reward_model_forward(QWEN05, replace(plan, numerics_guard=False), ROWS, SEQ)
    widest = max(i * o for i, o in QWEN05.linear_shapes())
    assert unguarded["reward_model.compute_copy"] == widest * BYTES["float16"]
    # the residual stream is float32 (autocast's float16 outputs are added to float32 embeddings)
    assert unguarded["activations (1 layer)"] == tokens * layer_forward_bytes(QWEN05, "float16", "float32",
                                                                             plan.attn_implementation, SEQ)
    guarded = reward_model_forward(QWEN05, plan, ROWS, SEQ)
    assert guarded["activations (1 layer)"] == tokens * layer_forward_bytes(QWEN05, "float32", "float32",
                                                                           plan.attn_implementation, SEQ)
    assert sum(guarded.values()) > sum(unguarded.values())


@pytest.mark.parametrize("offload", [True, False])
def test_weights_are_in_the_pass_and_resident_elsewhere_only_on_the_device(offload):
    plan = rm_plan()
    rm = replace(plan.reward_model, param_offload=offload)
    wl = Workload(prompt_length=512, response_length=256, rollout_batch_per_gpu=32)
    kw = dict(device_memory_gb=139.8, critic=plan.critic)
    without = estimate_memory(QWEN05, wl, plan.actor, plan.rollout, **kw)
    est = estimate_memory(QWEN05, wl, plan.actor, plan.rollout, **kw, reward_model=rm, reward_model_spec=QWEN05)
    weights = reward_model_params(QWEN05) * 2 / GiB
    phase = est.phases["reward_model"].terms
    assert phase["reward_model.weights"] == pytest.approx(weights)
    forward = sum(reward_model_forward(QWEN05, rm, 32, 768).values()) / GiB
    idle = sum(v for k, v in phase.items() if k.startswith(("actor.", "critic.")))
    assert est.phases["reward_model"].total_gb == pytest.approx(weights + forward + idle)
    for name, p in without.phases.items():
        assert est.phases[name].total_gb == pytest.approx(p.total_gb + (0.0 if offload else weights))


def test_the_plan_row_shows_the_reward_models_peak():
    plan = rm_plan()
    peak = plan.memory["phases_total"]["reward_model"]["total_gb"]
    assert plan.reward_model.predicted_peak_gb == pytest.approx(peak, abs=1e-3) and peak > 1.0
    assert f"{plan.reward_model.predicted_peak_gb:8.2f}" in [line for line in format_plan(plan).splitlines()
                                                           if line.startswith("  rm ")][0]


@pytest.mark.parametrize("n", [1, 4])
def test_t4_reward_model_plan_fits_the_device(n):
    plan = rm_plan("t4", n)
    t4 = get_profile("t4").memory_gb
    assert plan.memory["required_gb"] <= t4
    assert plan.reward_model.predicted_peak_gb == plan.memory["phases_total"]["reward_model"]["total_gb"]
    assert plan.reward_model.param_offload is True and plan.reward_model.predicted_peak_gb < t4


def test_weights_kept_on_the_device_that_do_not_fit_are_offloaded_with_a_warning():
    plan = rm_plan("t4", 4, reward__reward_model__rollout={"free_cache_engine": False})
    assert plan.reward_model.param_offload is True
    assert any("free_cache_engine=False" in w for w in plan.warnings)
    kept = rm_plan("h200", 4, reward__reward_model__rollout={"free_cache_engine": False})
    assert kept.reward_model.param_offload is False
    assert kept.memory["phases"]["actor_update"]["reward_model.weights"] > 0


def test_micro_batch_is_halved_until_the_pass_fits():
    """A 3B reward model (Qwen2.5-3B's shape) beside an offloaded 0.5B policy on a T4: its float32 weights
    leave room for fewer rows than the policy's log-prob micro-batch."""
    rm_3b = ModelSpec.from_hf_config(transformers.Qwen2Config(
        vocab_size=151936, hidden_size=2048, num_hidden_layers=36, num_attention_heads=16, num_key_value_heads=2,
        intermediate_size=11008, tie_word_embeddings=True))
    cfg = config(32, 512, 256, 32, 32, 32, actor_rollout_ref__rollout__n=4, **RM)
    plan = make_plan(get_profile("t4"), cfg, PLAIN, QWEN05, reward_model=rm_3b)
    rm = plan.reward_model
    assert 1 <= rm.micro_batch_size_per_gpu < plan.actor.forward_micro_batch_size_per_gpu
    assert "halved" in plan.reasons["reward_model.micro_batch_size_per_gpu"]
    assert plan.memory["required_gb"] <= get_profile("t4").memory_gb
    assert plan.memory["peak_phase"] == "reward_model"


def test_a_reward_model_that_never_fits_is_refused_naming_it():
    big = replace(QWEN05, num_params=40 * 10 ** 9)
    with pytest.raises(MemoryShortfall, match="reward model does not fit on t4"):
        make_plan(get_profile("t4"), config(32, 512, 256, 32, 32, 32, **RM), PLAIN, QWEN05, reward_model=big)
