"""A tiny Qwen2.5-VL under the real CPU plan: the images reach the model in generation and in the log-prob
and update passes, with the planner's decisions for the vision tower.

Float32 on CPU. The reference is transformers itself: its greedy `generate` from the processor's output
(which computes the multimodal positions on its own) must pick the tokens the built-in engine picks from
our left-padded batch and our (4, seq) positions.
"""
import pytest
import torch
from omegaconf import OmegaConf

from vision_data import geo3k_parquet, tiny_vl_model
from worker_setup import actor_rollout_ref_config, cpu_plan
from verl.protocol import DataProto
from verl.utils.dataset.rl_dataset import collate_fn, create_rl_dataset
from verl.workers.model_building.loading import build_model, load_processor, load_tokenizer
from tiny_vl_model import tiny_images
from verl.workers.actor.dp_actor import DataParallelPPOActor, Precision
from verl.workers.rollout.hf_rollout import HFRollout

MAX_PROMPT, RESPONSE = 96, 6


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    model_dir = tiny_vl_model(tmp_path_factory.mktemp("tiny_vl"))
    data = geo3k_parquet(tmp_path_factory.mktemp("geo3k"), rows_per_split=4)
    config = OmegaConf.create({"max_prompt_length": MAX_PROMPT, "filter_overlong_prompts": False})
    dataset = create_rl_dataset(str(data / "train.parquet"), config, load_tokenizer(model_dir),
                                load_processor(model_dir))
    plan = cpu_plan(model_dir, data__max_prompt_length=MAX_PROMPT, data__max_response_length=RESPONSE,
                    actor_rollout_ref__model__use_remove_padding="auto", algorithm__adv_estimator="grpo")
    return model_dir, dataset, plan


def _batch(rows) -> DataProto:
    batch = DataProto.from_single_dict(collate_fn(rows))
    batch.meta_info.update(eos_token_id=2, pad_token_id=0)
    return batch


def _with_image(dataset, index, image):
    """Row `index` of the data set with its image replaced by `image` (same prompt, same token count)."""
    row = dataset[index]
    pixels = dataset.processor.image_processor(images=[image], return_tensors="pt")
    row["multi_modal_inputs"] = {"pixel_values": pixels["pixel_values"], "image_grid_thw": pixels["image_grid_thw"]}
    row["multi_modal_data"] = {"image": [image]}
    return row


@pytest.mark.parametrize("device", ["cpu", "h200", "p40"])
def test_plan_decides_the_vision_tower(setup, device):
    model_dir, _, _ = setup
    plan = cpu_plan(model_dir, device=device, data__max_prompt_length=MAX_PROMPT, algorithm__adv_estimator="grpo",
                    actor_rollout_ref__model__use_remove_padding="auto",
                    actor_rollout_ref__actor__freeze_vision_tower=device == "p40")
    for role in (plan.actor, plan.ref):
        assert role.attn_implementation in ("sdpa", "eager", "flash_attention_2")
        assert role.use_remove_padding is False   # (4, seq) positions are not packed
    assert plan.reasons["vision.dtype"].startswith(f"the vision tower computes in the actor's compute dtype "
                                                   f"({plan.actor.compute_dtype})")
    assert plan.reasons["vision.frozen"].startswith("actor.freeze_vision_tower=True" if device == "p40"
                                                    else "the tower trains")
    assert "tower parameters counted" in plan.reasons["vision.memory"]
    # the built-in engine decodes a VL model's text tokens with its static decoder: the text model's graph rule
    assert plan.rollout.cuda_graphs is (device != "cpu") and plan.rollout.enforce_eager is (device == "cpu")


def test_a_critic_on_a_vl_model_is_refused_by_the_plan(setup):
    from verl.compat.planning.decider import PlanError

    model_dir, _, _ = setup
    with pytest.raises(PlanError, match=r"critic \(value head\) on a vision-language model .*adv_estimator=grpo"):
        cpu_plan(model_dir, algorithm__adv_estimator="gae", data__max_prompt_length=MAX_PROMPT)


def test_vision_rules_replace_packing_and_fork_kernels(setup):
    """Where the text model would pack with a variable-length kernel, a VL model is planned padded on SDPA."""
    from dataclasses import replace

    from verl.compat.planning.decider import Decider
    from verl.compat.device.detect import detect_profile, detect_software
    from verl.compat.planning.model_spec import ModelSpec
    from verl.compat.planning.vision import decide_vision

    model_dir, _, plan = setup
    profile = detect_profile("h200")
    d = Decider(profile, detect_software(profile), strict=False)
    packed = replace(plan.actor, attn_implementation="torch_varlen", use_remove_padding=True)
    config = OmegaConf.create({"actor_rollout_ref": {"model": {"use_remove_padding": "auto"}}})
    roles = decide_vision(d, config, {"actor": packed}, ModelSpec.from_pretrained(model_dir).vision, MAX_PROMPT)
    assert (roles["actor"].attn_implementation, roles["actor"].use_remove_padding) == ("sdpa", False)
    assert "vision-language model" in d.reasons["actor.use_remove_padding"] and not d.warnings
    # asked for explicitly, it is an adaptation with a warning naming the key
    config.actor_rollout_ref.model.use_remove_padding = True
    config.actor_rollout_ref.model.attn_implementation = "torch_varlen"
    decide_vision(d, config, {"actor": packed}, ModelSpec.from_pretrained(model_dir).vision, MAX_PROMPT)
    assert any("actor_rollout_ref.model.use_remove_padding=True" in w for w in d.warnings)
    assert any("actor_rollout_ref.model.attn_implementation=torch_varlen" in w for w in d.warnings)


def test_changing_the_image_changes_the_log_probs(setup):
    model_dir, dataset, plan = setup
    model = build_model(model_dir, plan.actor, train=False)
    rollout = HFRollout(model, actor_rollout_ref_config(model_dir).rollout, plan)
    prompts = _batch([dataset[0], dataset[1]])
    prompts.meta_info.update(do_sample=False, response_length=RESPONSE)
    generated = rollout.generate_sequences(prompts)
    assert generated.batch["position_ids"].shape == (2, 4, MAX_PROMPT + RESPONSE)
    assert "multi_modal_inputs" not in generated.non_tensor_batch   # the caller keeps its own copy

    actor = DataParallelPPOActor(OmegaConf.create({"ppo_mini_batch_size": 2}), model, precision=Precision("cpu"))
    meta = {"micro_batch_size": 1, "temperature": 1.0}

    def log_probs(rows):
        batch = _batch(rows)
        batch.batch.update({k: generated.batch[k][: len(rows)] for k in ("input_ids", "attention_mask",
                                                                         "position_ids", "responses")})
        batch.meta_info.update(meta)
        return actor.compute_log_prob(batch)[0]

    same = log_probs([dataset[0], dataset[1]])
    other = log_probs([_with_image(dataset, 0, tiny_images(1, seed=99)[0]), dataset[1]])
    # the first row saw another image: its log-probs move; the second row's do not (per-row pixel inputs)
    assert (same[0] - other[0]).abs().max() > 1e-3
    torch.testing.assert_close(same[1], other[1], rtol=0, atol=1e-6)
    # one micro-batch of two rows equals two micro-batches of one: each row gets its own pixels
    meta["micro_batch_size"] = 2
    torch.testing.assert_close(log_probs([dataset[0], dataset[1]]), same, rtol=0, atol=1e-5)
    # token-budget micro-batches (the GPU plans' use_dynamic_bsz) regroup rows; pixels follow them
    meta.update(use_dynamic_bsz=True, max_token_len=MAX_PROMPT + RESPONSE)
    torch.testing.assert_close(log_probs([dataset[0], dataset[1]]), same, rtol=0, atol=1e-5)


def test_builtin_engine_greedy_equals_transformers_generate(setup, monkeypatch):
    """Through the static decoder (the HF decode loop is not called), two rows of different prompt
    lengths, left-padded in one batch, each equal to `generate` on its own unpadded prompt."""
    model_dir, dataset, plan = setup
    model = build_model(model_dir, plan.actor, train=False)
    rollout = HFRollout(model, actor_rollout_ref_config(model_dir).rollout, plan)
    assert rollout.static_unsupported() is None
    monkeypatch.setattr(HFRollout, "_hf_passes", lambda *a, **k: pytest.fail("the HF decode loop ran"))
    rows = [dataset[0], dataset[2]]
    assert rows[0]["attention_mask"].sum() != rows[1]["attention_mask"].sum()   # different left padding
    prompts = _batch(rows)
    prompts.meta_info.update(do_sample=False, response_length=RESPONSE)
    prompts.meta_info["eos_token_id"] = -1   # never stop: compare every step
    ours = rollout.generate_sequences(prompts).batch["responses"]

    processor = load_processor(model_dir)
    for i, row in enumerate(rows):
        text = processor.tokenizer.decode(row["raw_prompt_ids"])   # one image pad: the processor widens it
        inputs = processor(text=[text], images=row["multi_modal_data"]["image"], return_tensors="pt")
        inputs.pop("token_type_ids", None)   # transformers 4.x's processor adds them; its generate refuses them
        assert torch.equal(inputs["input_ids"][0], row["input_ids"][row["attention_mask"].bool()])
        with torch.no_grad():
            theirs = model.generate(**inputs, max_new_tokens=RESPONSE, min_new_tokens=RESPONSE, do_sample=False,
                                    eos_token_id=None, pad_token_id=0)
        assert ours[i].tolist() == theirs[0, inputs["input_ids"].shape[1]:].tolist()


def _rotary_table_f64(positions, head_dim: int, theta: float):
    """1-D rotary cos/sin (len, head_dim) in float64: angle p * theta^(-2i/head_dim), halves repeated."""
    inv = theta ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = positions.double()[:, None] * inv
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def test_equal_mrope_positions_are_one_dimensional_rotary(setup):
    """What the static decoder relies on for a VL model's generated (text) tokens: the model's mrope
    module given equal (temporal, height, width) positions returns the ordinary 1-D rotary table (every
    section reads the same inverse frequencies), and so does the decoder's table built from it."""
    from verl.workers.rollout.static_decoder import _rotary_table

    model_dir, _, plan = setup
    model = build_model(model_dir, plan.actor, train=False)
    rotary = model.model.language_model.rotary_emb
    text = model.config.get_text_config()
    head_dim, theta = text.hidden_size // text.num_attention_heads, 10000.0
    positions = torch.tensor([0, 1, 7, 95, 300, 1500])
    x = torch.zeros(1, dtype=torch.float32)
    cos, sin = rotary(x, positions.view(1, 1, -1).expand(3, 1, -1))
    if cos.dim() == 4:   # transformers 4.x: one table per axis, sections chosen in the attention
        cos, sin = cos[0], sin[0]
    ref_cos, ref_sin = _rotary_table_f64(positions, head_dim, theta)
    torch.testing.assert_close(cos[0].double(), ref_cos, rtol=0, atol=1e-4)
    torch.testing.assert_close(sin[0].double(), ref_sin, rtol=0, atol=1e-4)
    table_cos, table_sin = _rotary_table(rotary, 1501, torch.float32, torch.device("cpu"), multimodal=True)
    torch.testing.assert_close(table_cos[positions].double(), ref_cos, rtol=0, atol=1e-4)
    torch.testing.assert_close(table_sin[positions].double(), ref_sin, rtol=0, atol=1e-4)
    # the check can fail: unequal axes (an image token's positions) do not give the 1-D table
    apart = rotary(x, torch.stack([positions, positions + 50, positions + 400])[:, None])[0]
    moved = (apart[1] - apart[0]) if apart.dim() == 4 else (apart[0].double() - ref_cos)   # 4.x: per-axis tables
    assert moved.abs().max() > 0.1


@pytest.mark.parametrize("sampling", [dict(do_sample=True, temperature=1.0),
                                      dict(do_sample=True, temperature=0.8, top_k=50, top_p=0.9)])
def test_static_vl_sampling_equals_the_hf_forward_path(setup, monkeypatch, sampling):
    """One seed, the same rows: the static decoder (HF prefill, static steps) and the HF forward at every
    step sample the same tokens from the same logits (float32 rounding apart); the static run calls the
    model's forward once (the prefill)."""
    from verl.workers.rollout import hf_rollout

    model_dir, dataset, plan = setup
    model = build_model(model_dir, plan.actor, train=False)
    config = actor_rollout_ref_config(model_dir).rollout
    seen = []
    pick = hf_rollout.sample_next_token
    monkeypatch.setattr(hf_rollout, "sample_next_token", lambda logits, *a: seen.append(logits.float()) or pick(logits, *a))

    def sample(force_hf: bool):
        seen.clear()
        rollout = HFRollout(model, config, plan)
        if force_hf:
            monkeypatch.setattr(rollout, "static_unsupported", lambda: "forced: the HF forward path")
        prompts = _batch([dataset[0], dataset[2], dataset[1]])
        prompts.meta_info.update(sampling, response_length=16, seed=1234)
        prompts.meta_info["eos_token_id"] = -1   # every step compared
        calls = []
        hook = model.register_forward_pre_hook(lambda *_: calls.append(1))
        try:
            return rollout.generate_sequences(prompts).batch["responses"], len(calls), torch.stack(seen)
        finally:
            hook.remove()

    static, static_calls, static_logits = sample(force_hf=False)
    hf, hf_calls, hf_logits = sample(force_hf=True)
    assert (static_calls, hf_calls) == (1, 16)
    torch.testing.assert_close(static_logits, hf_logits, rtol=0, atol=1e-4)
    assert torch.equal(static, hf)
    assert len(set(static.flatten().tolist())) > 10   # sampled, not one repeated token


def test_update_trains_the_tower_unless_frozen(setup):
    from verl.workers.model_building.loading import freeze_vision_tower, vision_tower

    model_dir, dataset, plan = setup
    for frozen in (False, True):
        model = build_model(model_dir, plan.actor, train=True)
        if frozen:
            freeze_vision_tower(model)
        optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.0)
        config = actor_rollout_ref_config(model_dir).actor
        actor = DataParallelPPOActor(config, model, optimizer, precision=Precision("cpu"))
        before = [p.detach().clone() for p in vision_tower(model).parameters()]
        batch = _batch([dataset[0], dataset[1]])
        rollout = HFRollout(model, actor_rollout_ref_config(model_dir).rollout, plan)
        batch.meta_info.update(response_length=RESPONSE)
        out = rollout.generate_sequences(batch)
        out.non_tensor_batch["multi_modal_inputs"] = batch.non_tensor_batch["multi_modal_inputs"]
        out.batch["old_log_probs"] = torch.zeros_like(out.batch["responses"], dtype=torch.float32) - 5.0
        out.batch["advantages"] = torch.ones_like(out.batch["old_log_probs"])
        actor.update_policy(out)
        moved = any(not torch.equal(b, p) for b, p in zip(before, vision_tower(model).parameters()))
        assert moved is not frozen


def test_numerics_guard_runs_a_vl_batch_with_its_pixels(setup, monkeypatch):
    """The fp16 guard forwards VL rows as the actor does: (4, 1, seq) positions and the row's own pixels."""
    from verl.compat.apply import numerics

    model_dir, dataset, plan = setup
    model = build_model(model_dir, plan.actor, train=True)
    batch = _batch([dataset[0], dataset[1]])
    inputs = {k: batch.batch[k] for k in ("input_ids", "attention_mask", "position_ids")}
    inputs["multi_modal_inputs"] = batch.non_tensor_batch["multi_modal_inputs"]
    seen = []
    forward = model.forward
    monkeypatch.setattr(model, "forward", lambda **kw: seen.append(kw) or forward(**kw))
    ok, reason = numerics.check_half_precision(model, numerics.guard_sample(inputs), "float16")
    assert ok, reason
    assert len(seen) == 4 and all(kw["position_ids"].shape[:2] == (4, 1) for kw in seen)
    torch.testing.assert_close(seen[0]["pixel_values"], inputs["multi_modal_inputs"][0]["pixel_values"])
    torch.testing.assert_close(seen[2]["pixel_values"], inputs["multi_modal_inputs"][1]["pixel_values"])


def test_vllm_requests_carry_the_images_and_the_raw_prompt(setup):
    """What the vLLM engine hands `LLM.generate` for image prompts (vLLM itself is not installed here):
    upstream's pair of the rendered prompt (one image pad per image, which vLLM widens) and the images."""
    from verl.workers.rollout.vllm_rollout import VLLMRollout

    _, dataset, _ = setup
    rows = [dataset[0], dataset[1]]
    requests = VLLMRollout._requests(_batch(rows))
    for request, row in zip(requests, rows):
        assert request["prompt_token_ids"] == row["raw_prompt_ids"]
        assert request["multi_modal_data"]["image"][0] is row["multi_modal_data"]["image"][0]
    text_only = _batch(rows)
    text_only.non_tensor_batch.pop("multi_modal_data")
    mask = rows[0]["attention_mask"].bool()
    assert VLLMRollout._requests(text_only)[0] == {"prompt_token_ids": rows[0]["input_ids"][mask].tolist()}
