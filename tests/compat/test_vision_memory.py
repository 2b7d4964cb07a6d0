"""The memory model's vision-tower terms against the real Qwen2.5-VL tower on CPU.

A 2-block slice of Qwen2.5-VL-3B's tower (its width, heads, MLP, window and merge; one window block, one
full-attention block) runs over a 224x224 image (256 patches). Measured with the storage-counting
dispatch mode of benchmarks/memory_model.py: the bytes of every storage its forward creates that are still
alive when the forward returns (what backward keeps, plus the merged output), and the most alive at once in
a forward without gradients. Each must match `verl.compat.planning.vision`'s formula within 10%.
"""
import gc
import importlib.util
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tiny_vl_model import QWEN25_VL_3B  # noqa: E402

from verl.compat.planning.vision import VisionSpec, tower_forward_bytes, tower_saved_bytes  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("memory_benchmark_vision", ROOT / "benchmarks" / "memory_model.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

IMAGES, SIDE = 1, 224
PATCHES_PER_IMAGE = (SIDE // 14) ** 2


def _tower(dtype: torch.dtype, attn: str, checkpointed: bool = False):
    from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel

    cfg = Qwen2_5_VLVisionConfig(depth=2, hidden_size=QWEN25_VL_3B["vision_hidden_size"],
                                 intermediate_size=QWEN25_VL_3B["vision_intermediate_size"],
                                 num_heads=QWEN25_VL_3B["vision_heads"], out_hidden_size=QWEN25_VL_3B["hidden_size"],
                                 patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=112,
                                 fullatt_block_indexes=[1])
    cfg._attn_implementation = attn
    torch.manual_seed(0)
    tower = Qwen2_5_VisionTransformerPretrainedModel(cfg).to(dtype)
    if checkpointed:
        tower.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    tower.train()
    return tower, VisionSpec.from_hf_config(lambda k, d=None: getattr(cfg, k, d))


def _measure(tower, dtype: torch.dtype, grad: bool) -> tuple[int, int]:
    """(bytes alive when the forward returns, most bytes alive at once), pixels and weights excluded."""
    g = SIDE // 14
    grid = torch.tensor([[1, g, g]] * IMAGES)
    pixels = torch.randn(IMAGES * g * g, 1176, generator=torch.Generator().manual_seed(0))
    resident = set(bench.resident_storages(tower)) | {pixels.untyped_storage().data_ptr()}
    tracker = bench._live_bytes_mode(resident)
    gc.collect()
    gc.disable()
    try:
        autocast = torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32)
        with torch.set_grad_enabled(grad), autocast, tracker:
            out = tower(pixels, grid_thw=grid)
            out = getattr(out, "pooler_output", out)   # transformers 4.x returns the merged features as a tensor
        alive = tracker.live
    finally:
        gc.enable()
    del out
    return alive, tracker.peak


@pytest.mark.parametrize("dtype,attn", [(torch.float32, "sdpa"), (torch.bfloat16, "sdpa"), (torch.float32, "eager")])
def test_what_a_trained_tower_keeps_for_backward_matches_the_formula(dtype, attn):
    tower, spec = _tower(dtype, attn)
    saved, _ = _measure(tower, dtype, grad=True)
    name = str(dtype).removeprefix("torch.")
    formula = tower_saved_bytes(spec, name, name, attn, IMAGES * PATCHES_PER_IMAGE, PATCHES_PER_IMAGE)
    assert saved == pytest.approx(formula, rel=0.10)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_checkpointed_tower_keeps_its_blocks_inputs(dtype):
    tower, spec = _tower(dtype, "sdpa", checkpointed=True)
    saved, _ = _measure(tower, dtype, grad=True)
    name = str(dtype).removeprefix("torch.")
    formula = tower_saved_bytes(spec, name, name, "sdpa", IMAGES * PATCHES_PER_IMAGE, PATCHES_PER_IMAGE,
                                checkpointed=True)
    assert saved == pytest.approx(formula, rel=0.10)
    assert formula < 0.4 * tower_saved_bytes(spec, name, name, "sdpa", IMAGES * PATCHES_PER_IMAGE, PATCHES_PER_IMAGE)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_forward_without_gradients_holds_one_blocks_transients(dtype):
    tower, spec = _tower(dtype, "sdpa")
    _, peak = _measure(tower, dtype, grad=False)
    name = str(dtype).removeprefix("torch.")
    formula = tower_forward_bytes(spec, name, name, "sdpa", IMAGES * PATCHES_PER_IMAGE, PATCHES_PER_IMAGE)
    assert peak == pytest.approx(formula, rel=0.10)


# ----------------------------------------------------------------------------- the terms in the plan

def _vl_3b():
    from transformers import Qwen2_5_VLConfig

    from verl.compat.planning.model_spec import ModelSpec

    q = QWEN25_VL_3B
    cfg = Qwen2_5_VLConfig(
        text_config={"vocab_size": 151936, "hidden_size": q["hidden_size"], "intermediate_size": q["intermediate_size"],
                     "num_hidden_layers": q["num_layers"], "num_attention_heads": q["num_heads"],
                     "num_key_value_heads": q["num_kv_heads"], "tie_word_embeddings": True,
                     "rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "mrope_section": q["mrope_section"]}},
        vision_config={"depth": q["vision_depth"], "hidden_size": q["vision_hidden_size"],
                       "intermediate_size": q["vision_intermediate_size"], "num_heads": q["vision_heads"],
                       "out_hidden_size": q["hidden_size"], "window_size": 112, "fullatt_block_indexes": [7, 15, 23, 31]},
        tie_word_embeddings=True)
    return ModelSpec.from_hf_config(cfg)


def test_an_update_keeps_the_tower_unless_frozen_and_checkpointing_keeps_block_inputs():
    from dataclasses import replace

    from test_memory import HF, role

    from verl.compat.planning.memory import GiB, Workload, estimate_memory, vision_bytes

    spec, rows, tokens = _vl_3b(), 2, 256
    wl = Workload(prompt_length=512, response_length=256, rollout_batch_per_gpu=8, image_tokens=tokens)
    kept = {}
    fused = replace(role(micro=rows), fused_optimizer=True)   # no step scratch: the peak is in the pass
    for name, plan in {"saved": fused, "checkpointed": replace(fused, gradient_checkpointing=True),
                       "frozen": replace(fused, vision_frozen=True)}.items():
        terms = estimate_memory(spec, wl, plan, HF, device_memory_gb=140.0).phases["actor_update"].terms
        kept[name] = terms["vision tower"]
        assert kept[name] == pytest.approx(vision_bytes(spec, "bfloat16", "bfloat16", "sdpa", rows, tokens, name) / GiB)
    pixels = rows * tokens * 4 * 1176 * 4 / GiB
    assert kept["frozen"] == pytest.approx(pixels)
    assert kept["saved"] - pixels == pytest.approx(2 * 2.0275, rel=0.001)   # 2.03 GiB a sequence of 256 image tokens
    assert pixels < kept["checkpointed"] < kept["saved"] / 10
    text_only = estimate_memory(replace(spec, vision=None), wl, role(micro=rows), HF, device_memory_gb=140.0)
    assert "vision tower" not in text_only.phases["actor_update"].terms


def test_forwards_and_the_builtin_engine_count_the_towers_forward():
    from dataclasses import replace

    from test_memory import HF, role

    from verl.compat.planning.memory import (GiB, Workload, _generation_terms, estimate_memory,
                                             generation_bytes_per_sequence, vision_bytes)

    spec = _vl_3b()
    per_seq = {t: generation_bytes_per_sequence(spec, role(), HF, 512, 256, image_tokens=t) for t in (0, 512)}
    tower = vision_bytes(spec, "bfloat16", "bfloat16", "sdpa", 1, 512, "forward")
    kv = 2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * 768 * 2
    assert per_seq[512] == pytest.approx(kv + tower) and per_seq[512] > per_seq[0]
    # the prefill is the model's own forward: its cache over the prompt sits beside the decoder's whole cache
    prefill = _generation_terms(spec, role(), HF, 512, 256)[0]
    assert prefill["rollout.prefill_cache"] == pytest.approx(kv * 512 / 768)
    assert prefill["rollout.kv_cache"] == pytest.approx(kv)
    wl = Workload(prompt_length=512, response_length=256, rollout_batch_per_gpu=32, image_tokens=512)
    spec = replace(spec, vocab_size=520)   # tiny_vl_model's tokenizer (the H200 runs'): the tower is the peak
    log_prob = estimate_memory(spec, wl, role(micro=32), HF, device_memory_gb=140.0).phases["log_prob"]
    assert log_prob.terms["vision tower"] == pytest.approx(32 * tower / GiB)
    without = estimate_memory(spec, replace(wl, image_tokens=0), role(micro=32), HF, device_memory_gb=140.0)
    assert log_prob.total_gb > without.phases["log_prob"].total_gb


def test_the_fit_shrinks_the_update_for_image_activations_and_says_so():
    from dataclasses import replace

    from test_planner import PLAIN, config

    from verl.compat.device.catalog import get_profile
    from verl.compat.planning.planner import make_plan

    spec = _vl_3b()
    cfg = config(8, 512, 256, 8, "auto", "auto", algorithm__adv_estimator="grpo", actor_rollout_ref__rollout__n=4,
                 actor_rollout_ref__actor__use_dynamic_bsz=True)
    profile = replace(get_profile("h200"), host_memory_gb=128.0)
    vl, text = (make_plan(profile, cfg, PLAIN, m) for m in (spec, replace(spec, vision=None)))
    assert vl.actor.max_token_len_per_gpu < text.actor.max_token_len_per_gpu
    assert vl.memory["required_gb"] <= profile.memory_gb
    assert vl.memory["phases"]["actor_update"]["vision tower"] > 10   # ~4 GiB a sequence at the 512-token bound
    assert "micro-batches halved" in vl.reasons["vision.activations"]
    assert "vision.activations" not in text.reasons
