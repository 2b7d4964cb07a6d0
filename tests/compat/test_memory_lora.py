"""Memory model terms for LoRA, QLoRA, 8-bit AdamW, the reference served by the actor, and what FSDP2's
param offload really keeps on the device (exact bytes from the formulas in docs/compat.md)."""
import dataclasses

import pytest

from verl.compat.planning.memory import ADAMW8BIT_BYTES, NF4_BYTES, GiB, Workload, estimate_memory
from verl.compat.planning.model_spec import BUILTIN_MODELS, ModelSpec
from verl.compat.plan import RolePlan, RolloutPlan

QWEN7 = ModelSpec.from_hf_config(BUILTIN_MODELS["qwen2.5-7b"])
QWEN15 = ModelSpec.from_hf_config(BUILTIN_MODELS["qwen2.5-1.5b"])
WL = Workload(prompt_length=256, response_length=256, rollout_batch_per_gpu=32, update_batch_per_gpu=32)


def rp(compute="float32", param="float32", **kw):
    base = dict(param_dtype=param, compute_dtype=compute, grad_scaler=False, attn_implementation="sdpa",
                use_remove_padding=False, gradient_checkpointing=True, param_offload=False, optimizer_offload=False,
                micro_batch_size_per_gpu=1, forward_micro_batch_size_per_gpu=1, fsdp=False)
    return RolePlan(**{**base, **kw})


def rollout(dtype="float32"):
    return RolloutPlan(name="hf", dtype=dtype, gpu_memory_utilization=0.0, enforce_eager=True,
                       attn_implementation="sdpa", micro_batch_size=4)


def terms(est, phase):
    return est.phases[phase].terms


def test_adapter_counts_cover_every_decoder_linear_layer():
    h, q, kv, inter = 3584, 3584, 512, 18944
    per_layer = (h + q) + 2 * (h + kv) + (q + h) + 2 * (h + inter) + (inter + h)
    assert QWEN7.lora_params(32) == 28 * 32 * per_layer
    assert QWEN7.decoder_linear_params == 28 * (h * q + 2 * h * kv + q * h + 3 * h * inter)
    assert QWEN7.num_params == 7_615_616_512     # Qwen2.5-7B's published parameter count


def test_lora_base_is_frozen_in_its_store_and_only_the_adapters_train():
    lora = rp(lora_rank=32, frozen_dtype="float16")
    est = estimate_memory(QWEN7, WL, lora, rollout(), device_memory_gb=24, ref_in_actor=True)
    adapters = QWEN7.lora_params(32)
    update = terms(est, "actor_update")
    assert update["actor.weights"] == pytest.approx((QWEN7.num_params * 2 + adapters * 4) / GiB)
    assert update["actor.optimizer"] == pytest.approx(adapters * 8 / GiB)
    assert update["actor.grads"] == pytest.approx(adapters * 4 / GiB)
    assert "vocab grads (end of backward)" not in update or update["vocab grads (end of backward)"] == 0
    # unwrapped, float16 store, float32 compute: one matmul's weight upcast at a time (the output projection)
    assert terms(est, "log_prob")["actor.compute_copy"] == pytest.approx(QWEN7.vocab_size * QWEN7.hidden_size * 4 / GiB)
    # the reference pass is the actor's own forward: same terms, no second model
    assert terms(est, "ref") == terms(est, "log_prob") and not any(k.startswith("ref.") for k in terms(est, "ref"))
    # generation reads the stored base in place (nothing gathered)
    assert terms(est, "rollout")["rollout.gathered weights"] == 0


def test_4bit_base_stores_the_linear_weights_in_nf4():
    qlora = rp(compute="float16", param="float32", lora_rank=32, frozen_dtype="float16", base_quantization="nf4")
    est = estimate_memory(QWEN7, WL, qlora, rollout("float16"), device_memory_gb=15, ref_in_actor=True)
    rest = QWEN7.num_params - QWEN7.decoder_linear_params
    expected = QWEN7.decoder_linear_params * NF4_BYTES + rest * 2 + QWEN7.lora_params(32) * 4
    assert terms(est, "actor_update")["actor.weights"] == pytest.approx(expected / GiB)
    assert expected / GiB < 6.0        # vs 14.2 GiB for the float16 base


def test_8bit_adamw_keeps_one_byte_per_moment_and_steps_in_place():
    full = rp(compute="bfloat16", optimizer_8bit=True, fused_optimizer=False)
    est = estimate_memory(QWEN15, WL, full, rollout("bfloat16"), device_memory_gb=80)
    update = terms(est, "actor_update")
    assert update["actor.optimizer"] == pytest.approx(QWEN15.num_params * ADAMW8BIT_BYTES / GiB)
    assert update.get("optimizer step", 0) == 0
    plain = estimate_memory(QWEN15, WL, dataclasses.replace(full, optimizer_8bit=False), rollout("bfloat16"),
                            device_memory_gb=80)
    assert terms(plain, "actor_update")["actor.optimizer"] == pytest.approx(QWEN15.num_params * 8 / GiB)


def test_param_offload_keeps_weights_grads_and_the_step_on_the_host():
    """The p40 1.5B case of issue 25: the printed actor plan counted 28.75 GiB of weights, AdamW states,
    gradients and step scratch that FSDP2's CPUOffloadPolicy keeps in host memory."""
    off = rp(param_offload=True, optimizer_offload=True, fsdp=True)
    ref = rp(param_offload=True, fsdp=True, frozen_dtype="float16")
    est = estimate_memory(QWEN15, WL, off, rollout(), ref=ref, device_memory_gb=24)
    update = terms(est, "actor_update")
    assert all(update.get(k, 0) == 0 for k in ("actor.weights", "actor.optimizer", "actor.grads", "optimizer step"))
    vh = QWEN15.vocab_size * QWEN15.hidden_size
    assert update["vocab grads (end of backward)"] == pytest.approx(3 * vh * 4 / GiB)   # tied: 3 x, float32
    assert est.phases["actor_update"].total_gb < 6.0       # was 28.75 GiB
    # generation still gathers the whole actor (fsdp_utils.full_params)
    assert terms(est, "rollout")["rollout.gathered weights"] == pytest.approx(QWEN15.num_params * 4 / GiB)


def test_lora_needs_far_less_than_full_training_of_the_same_model():
    lora = estimate_memory(QWEN7, WL, rp(compute="bfloat16", lora_rank=32, frozen_dtype="bfloat16"),
                           rollout("bfloat16"), device_memory_gb=24, ref_in_actor=True)
    full = estimate_memory(QWEN7, WL, rp(compute="bfloat16", cast_on_gather=True, fsdp=True), rollout("bfloat16"),
                           ref=rp(compute="bfloat16", param="bfloat16"), device_memory_gb=80)
    assert lora.predicted_peak_gb < 0.5 * full.predicted_peak_gb
