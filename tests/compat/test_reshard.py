"""FSDP2's reshard_after_forward: the planner's rule per role and world size, the user's explicit value,
and the memory model's term for the weights kept gathered from forward to backward.

The shape is the Qwen2.5-0.5B one with a small batch and a fixed validation batch, so that the update
phases are the peak and no other decision of the fit moves with the device size the tests set.
"""
import dataclasses
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from test_planner import PLAIN, QWEN05, config  # noqa: E402

from verl.compat.device.catalog import CATALOG  # noqa: E402
from verl.compat.planning.fit import MULTI_RANK_RESHARD_HEADROOM  # noqa: E402
from verl.compat.planning.memory import GiB, Workload, estimate_memory  # noqa: E402
from verl.compat.planning.planner import PlanError, make_plan  # noqa: E402

ACTOR_KEY = "actor_rollout_ref.actor.fsdp_config.reshard_after_forward"
RESHARD_ALL = {"actor_rollout_ref__actor__fsdp_config__reshard_after_forward": True,
               "critic__fsdp__reshard_after_forward": True}


def plan(memory_gb: float = 80.0, gpus: int = 1, **extra):
    """Every role wrapped in FSDP2 (on one device a bfloat16 reference would otherwise run unwrapped,
    `test_wrapping.py`)."""
    profile = dataclasses.replace(CATALOG["a100-80gb"], memory_gb=memory_gb)
    extra.setdefault("compat__always_fsdp", True)
    cfg = config(16, 512, 512, 16, 4, 8, trainer__n_gpus_per_node=gpus, data__val_batch_size=16, **extra)
    return make_plan(profile, cfg, PLAIN, QWEN05)


def required(gpus: int, **extra) -> float:
    return plan(gpus=gpus, **extra).memory["required_gb"]


def test_one_device_keeps_gathered_weights_wherever_they_fit():
    kept, resharded = required(1), required(1, **RESHARD_ALL)
    assert kept > resharded                                          # the kept copy costs memory ...
    roomy = plan(kept + 0.05)                                        # ... and is taken while it fits at all
    assert roomy.actor.reshard_after_forward is False and roomy.critic.reshard_after_forward is False
    assert roomy.reasons["actor.reshard_after_forward"].startswith("one device")
    assert roomy.memory["required_gb"] == pytest.approx(kept)        # the predicted peak includes it
    tight = plan((kept + resharded) / 2)
    assert tight.actor.reshard_after_forward is True                 # the actor's copy no longer fits ...
    assert "upstream's default" in tight.reasons["actor.reshard_after_forward"]
    assert tight.critic.reshard_after_forward is False               # ... the critic's (decided next) does
    assert tight.memory["required_gb"] <= (kept + resharded) / 2
    assert not tight.warnings


def test_more_ranks_keep_upstreams_reshard_unless_memory_is_plentiful():
    kept = required(2)
    spare = 1 - MULTI_RANK_RESHARD_HEADROOM
    short = plan(kept / (spare + 0.05), gpus=2)       # the actor update, the plan's peak, fits without the headroom
    assert short.actor.reshard_after_forward is True
    assert short.reasons["actor.reshard_after_forward"].endswith("less than 25% of the device to spare")
    assert not short.warnings
    critic_update = short.memory["phases_total"]["critic_update"]["total_gb"]
    assert critic_update < short.memory["phases_total"]["actor_update"]["total_gb"]
    assert short.critic.reshard_after_forward is False                # the critic's smaller update has room
    plenty = plan(kept / (spare - 0.05), gpus=2)
    assert plenty.actor.reshard_after_forward is False
    assert plenty.reasons["actor.reshard_after_forward"].startswith("memory is plentiful at 2 ranks")


def test_the_reference_and_offloaded_roles_reshard():
    p = plan(actor_rollout_ref__actor__use_kl_loss=True, critic__fsdp__param_offload=True)
    assert p.ref.reshard_after_forward is True and "no backward" in p.reasons["ref.reshard_after_forward"]
    assert p.critic.reshard_after_forward is True and "offloaded" in p.reasons["critic.reshard_after_forward"]
    assert p.actor.reshard_after_forward is False


def test_an_explicit_value_is_kept_and_an_explicit_false_that_does_not_fit_is_adapted():
    kept, resharded = required(1), required(1, **RESHARD_ALL)
    explicit = plan(**RESHARD_ALL)
    assert explicit.actor.reshard_after_forward is True
    assert explicit.reasons["actor.reshard_after_forward"] == "set by the user"
    # at 2 ranks without the headroom compat would reshard; the user's false still fits, so it is kept
    short = required(2) / (1 - MULTI_RANK_RESHARD_HEADROOM + 0.05)
    honoured = plan(short, gpus=2, actor_rollout_ref__actor__fsdp_config__reshard_after_forward=False)
    assert honoured.actor.reshard_after_forward is False and not honoured.warnings
    assert honoured.reasons["actor.reshard_after_forward"].startswith("set by the user")
    between = (kept + resharded) / 2
    adapted = plan(between, actor_rollout_ref__actor__fsdp_config__reshard_after_forward="false")
    assert adapted.actor.reshard_after_forward is True
    assert any(w.startswith(f"{ACTOR_KEY}=False is not possible") and "using True" in w for w in adapted.warnings)
    with pytest.raises(PlanError, match=ACTOR_KEY):
        plan(between, actor_rollout_ref__actor__fsdp_config__reshard_after_forward=False, compat__strict=True)


def test_the_critics_older_key_is_read_too():
    p = plan(critic__model__fsdp_config__reshard_after_forward=True)
    assert p.critic.reshard_after_forward is True and p.actor.reshard_after_forward is False


def test_without_a_model_config_upstreams_default_or_the_users_value():
    profile = CATALOG["h200"]
    auto = make_plan(profile, config(16, 512, 512, 16, 4, 8), PLAIN, None)
    assert auto.actor.reshard_after_forward is True and "cannot be sized" in auto.reasons["actor.reshard_after_forward"]
    user = make_plan(profile, config(16, 512, 512, 16, 4, 8, critic__fsdp__reshard_after_forward=False), PLAIN, None)
    assert user.critic.reshard_after_forward is False


# ----------------------------------------------------------------------------- memory model

def test_kept_weights_add_every_layer_in_the_gather_dtype_to_the_update_only():
    p = plan(actor_rollout_ref__actor__use_kl_loss=True)
    wl = Workload(prompt_length=512, response_length=512, rollout_batch_per_gpu=16, update_batch_per_gpu=16)

    def phases(reshard: bool):
        actor, critic = (dataclasses.replace(r, reshard_after_forward=reshard) for r in (p.actor, p.critic))
        est = estimate_memory(QWEN05, wl, actor, p.rollout, critic, p.ref, device_memory_gb=80.0)
        return {name: phase.terms for name, phase in est.phases.items()}

    kept, resharded = phases(False), phases(True)
    assert p.actor.cast_on_gather and p.actor.compute_dtype == "bfloat16"   # gathered in bfloat16: 2 bytes
    root = QWEN05.vocab_size * QWEN05.hidden_size                          # tied: the embedding alone
    per_layer = (QWEN05.num_params - root) / QWEN05.num_layers
    extra = (QWEN05.num_params - root - 2 * per_layer) * 2 / GiB           # every layer, not two prefetched
    assert kept["actor_update"]["actor.compute_copy"] - resharded["actor_update"]["actor.compute_copy"] == \
        pytest.approx(extra)
    assert kept["actor_update"]["actor.compute_copy"] == pytest.approx(QWEN05.num_params * 2 / GiB)
    assert sum(kept["actor_update"].values()) - sum(resharded["actor_update"].values()) == pytest.approx(extra)
    for phase in ("rollout", "validation", "log_prob", "ref", "values"):   # forwards without gradients reshard
        assert kept[phase] == resharded[phase], phase




# ----------------------------------------------------------------------------- gather_for_forward

def test_forward_passes_gather_the_whole_model_once_where_it_fits():
    """Log-probs, reference log-probs and values hold the whole model for the call at world size 1;
    a role whose parameters live on the host keeps FSDP2's per-layer gathers."""
    kl = {"actor_rollout_ref__actor__use_kl_loss": True}
    roomy = plan(**kl)
    for role in ("actor", "ref", "critic"):
        assert getattr(roomy, role).gather_for_forward is True, role
        assert roomy.reasons[f"{role}.gather_for_forward"].startswith("one gather per call"), role
    offloaded = plan(**kl, critic__fsdp__param_offload=True)
    assert offloaded.critic.gather_for_forward is False and offloaded.actor.gather_for_forward is True
    assert "offloaded" in offloaded.reasons["critic.gather_for_forward"]
    grpo = plan(algorithm__adv_estimator="grpo")
    assert grpo.critic is None and "critic.gather_for_forward" not in grpo.reasons


def test_a_gathered_forward_counts_the_whole_model_in_its_pass_only():
    p = plan(actor_rollout_ref__actor__use_kl_loss=True)
    wl = Workload(prompt_length=512, response_length=512, rollout_batch_per_gpu=16, update_batch_per_gpu=16)

    def phases(gathered: bool):
        actor, critic, ref = (dataclasses.replace(r, gather_for_forward=gathered) for r in (p.actor, p.critic, p.ref))
        est = estimate_memory(QWEN05, wl, actor, p.rollout, critic, ref, device_memory_gb=80.0)
        return {name: phase.terms for name, phase in est.phases.items()}

    whole, per_layer = phases(True), phases(False)
    for phase, role, params in (("log_prob", "actor", QWEN05.num_params), ("ref", "ref", QWEN05.num_params),
                                ("values", "critic", QWEN05.critic_params)):
        # the whole model in the bfloat16 gather dtype (2 bytes), where per layer at most root + two layers
        assert whole[phase][f"{role}.compute_copy"] == pytest.approx(params * 2 / GiB, rel=1e-6), phase
        assert per_layer[phase][f"{role}.compute_copy"] < whole[phase][f"{role}.compute_copy"] / 2, phase
    for phase in ("rollout", "validation", "actor_update", "critic_update"):
        assert whole[phase] == per_layer[phase], phase
