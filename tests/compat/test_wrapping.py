"""Whether each role is wrapped in FSDP2: the rule (verl.compat.planning.wrapping), the planner's use of it per
device and setting, and what the memory model stops counting for an unwrapped model.

The field report's settings on the P40 (float32 everywhere, one device) are the case it is for: FSDP2
shards nothing there, and its gather was a second copy of the actor while generating.
"""
import dataclasses
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from test_planner import FIELD, PLAIN, QUICKSTART, QWEN05, config  # noqa: E402

from verl.compat.device.catalog import CATALOG  # noqa: E402
from verl.compat.planning.memory import GiB  # noqa: E402
from verl.compat.plan import RolePlan  # noqa: E402
from verl.compat.planning.planner import make_plan  # noqa: E402
from verl.compat.planning.wrapping import wraps_in_fsdp  # noqa: E402

FP32 = RolePlan(param_dtype="float32", compute_dtype="float32", grad_scaler=False, attn_implementation="sdpa",
                use_remove_padding=False, gradient_checkpointing=False, param_offload=False, optimizer_offload=False)


def test_the_rule():
    assert wraps_in_fsdp(FP32, ranks=1)[0] is False
    assert "runs unwrapped" in wraps_in_fsdp(FP32, ranks=1)[1]
    assert wraps_in_fsdp(FP32, ranks=2)[0] is True                               # shards across ranks
    assert wraps_in_fsdp(FP32, ranks=1, always=True)[0] is True                   # the user's choice
    assert wraps_in_fsdp(dataclasses.replace(FP32, param_offload=True), ranks=1)[0] is True   # host offload
    bf16_gather = dataclasses.replace(FP32, compute_dtype="bfloat16", cast_on_gather=True)
    assert wraps_in_fsdp(bf16_gather, ranks=1)[0] is True                         # FSDP2 casts as it gathers
    autocast = dataclasses.replace(FP32, compute_dtype="float16", cast_on_gather=False)
    assert wraps_in_fsdp(autocast, ranks=1)[0] is False                           # autocast casts, not FSDP2
    frozen_bf16 = dataclasses.replace(FP32, param_dtype="bfloat16", compute_dtype="bfloat16", cast_on_gather=True)
    assert wraps_in_fsdp(frozen_bf16, ranks=1)[0] is False                        # nothing to cast


def test_field_report_on_the_p40_runs_unwrapped_and_generates_without_a_gathered_copy():
    plan = make_plan(CATALOG["p40"], FIELD, PLAIN, QWEN05)
    wrapped = make_plan(CATALOG["p40"], config(1, 256, 256, 1, 1, 1, compat__always_fsdp=True), PLAIN, QWEN05)
    assert plan.actor.fsdp is False and plan.critic.fsdp is False
    assert plan.reasons["actor.fsdp"].startswith("one device")
    assert "nothing is gathered" in plan.reasons["actor.reshard_after_forward"]
    assert plan.actor.gather_for_forward is False
    assert wrapped.actor.fsdp is True and wrapped.reasons["actor.fsdp"].startswith("compat.always_fsdp")
    actor_weights = QWEN05.num_params * 4 / GiB
    for phase in ("rollout", "validation"):
        assert plan.memory["phases"][phase]["rollout.gathered weights"] == 0
        assert wrapped.memory["phases"][phase]["rollout.gathered weights"] == pytest.approx(actor_weights, abs=1e-3)
        saved = (wrapped.memory["phases_total"][phase]["total_gb"] - plan.memory["phases_total"][phase]["total_gb"])
        assert saved == pytest.approx(actor_weights, abs=2e-3), phase
    for phase in ("log_prob", "values", "actor_update", "critic_update"):     # no compute copy anywhere
        assert plan.memory["phases_total"][phase]["total_gb"] < wrapped.memory["phases_total"][phase]["total_gb"]
        terms = plan.memory["phases"][phase]
        assert not any(k.endswith("compute_copy") and v for k, v in terms.items()), (phase, terms)
    assert plan.predicted_peak_gb < wrapped.predicted_peak_gb - actor_weights + 0.01
    # an update (one micro-batch): the resident state and its gradients; the embedding's rows go into .grad
    # in place, so no vocabulary matrix is added, and the fused AdamW step adds nothing (measured on the H200)
    for phase, role in (("actor_update", "actor"), ("critic_update", "critic")):
        terms = plan.memory["phases"][phase]
        assert plan.reasons[f"{role}.fused_optimizer"].startswith("fused AdamW")
        assert terms.get("optimizer step", 0) == 0
        assert terms.get("vocab grads (end of backward)", 0) == 0
        assert f"{role}.grads" in terms


def test_what_keeps_fsdp_on_one_device():
    quick = make_plan(CATALOG["h200"], QUICKSTART, PLAIN, QWEN05)          # bf16 compute, fp32 master weights
    assert quick.actor.fsdp is True and quick.critic.fsdp is True
    assert "casts the float32 weights to bfloat16" in quick.reasons["actor.fsdp"]
    grpo = make_plan(CATALOG["h200"], config(256, 512, 512, 64, 4, 8, algorithm__adv_estimator="grpo",
                                             actor_rollout_ref__actor__use_kl_loss=True), PLAIN, QWEN05)
    assert grpo.ref.fsdp is False                                         # bf16 weights computed in bf16
    offloaded = make_plan(CATALOG["p40"], config(1, 256, 256, 1, 1, 1, critic__fsdp__param_offload=True), PLAIN, QWEN05)
    assert offloaded.critic.fsdp is True and "host memory" in offloaded.reasons["critic.fsdp"]
    assert offloaded.actor.fsdp is False


def test_several_ranks_always_shard():
    cfg = config(8, 256, 256, 8, 1, 1, trainer__n_gpus_per_node=2)
    plan = make_plan(CATALOG["p40"], cfg, PLAIN, QWEN05)
    assert plan.actor.fsdp is True and plan.critic.fsdp is True
    assert plan.reasons["actor.fsdp"].startswith("2 ranks")
