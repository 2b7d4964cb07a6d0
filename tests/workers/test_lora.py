"""LoRA on the actor worker (peft), with the plan from the real planner (`actor_rollout_ref.model.lora_rank`).

Checked: only the adapters train; the merged weights (what vLLM is pushed, and what the merger writes)
give the adapter model's logits; reference log-probs with the adapters disabled equal a separate base
model's; save -> resume continues exactly; `python -m verl.model_merger merge` writes the merged folder and
a peft adapter folder that loads back to the same logits. Tiny Qwen2, float32, CPU.
"""
import json
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from worker_setup import actor_rollout_ref_config, cpu_plan, ppo_batch, run_ranks, tiny_model  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))

pytest.importorskip("peft", reason="LoRA needs peft (pip install 'verl[peft]')")

from verl.protocol import DataProto  # noqa: E402
from verl.utils import fsdp_utils, lora  # noqa: E402
from verl.workers.fsdp_workers import ActorRolloutRefWorker  # noqa: E402

RANK = 8
PROBE = torch.tensor([[5, 17, 33, 2, 41, 9, 12, 50], [7, 7, 21, 3, 30, 44, 1, 19]])


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model(str(tmp_path_factory.mktemp("lora_model")))


def lora_config(model_dir, **model_keys):
    cfg = actor_rollout_ref_config(model_dir, use_kl_loss=True)
    cfg.actor.optim.lr = 5e-2   # large enough that one step moves the adapters visibly
    for key, value in {"lora_rank": RANK, "lora_alpha": 16, "target_modules": "all-linear",
                       "exclude_modules": None, "lora_adapter_path": None, **model_keys}.items():
        cfg.model[key] = value
    return cfg


def lora_worker(model_dir, device="cpu", role="actor_rollout_ref", **overrides):
    plan = cpu_plan(model_dir, device=device, actor_rollout_ref__model__lora_rank=RANK, **overrides)
    worker = ActorRolloutRefWorker(lora_config(model_dir), role=role, plan=plan)
    worker.init_model()
    return worker


def train_step(worker, data):
    data.batch["old_log_probs"] = worker.compute_log_prob(data).batch["old_log_probs"]
    data.batch["ref_log_prob"] = worker.compute_ref_log_prob(data).batch["ref_log_prob"]
    return worker.update_actor(data).meta_info["metrics"]


def logits(model):
    with torch.no_grad():
        return model(input_ids=PROBE).logits


def test_only_adapters_train_and_the_reference_is_the_base(model_dir):
    worker = lora_worker(model_dir)
    assert worker.plan.ref_in_actor and worker.plan.ref is None and worker.plan.actor.lora_rank == RANK
    trainable = {n for n, p in worker.actor_module.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_A." in n or ".lora_B." in n for n in trainable)
    # all-linear: every projection of every layer, not the output head
    assert sum(".lora_A." in n for n in trainable) == 2 * 7 and not any(n.startswith("lm_head") for n in trainable)
    assert {id(p) for g in worker.actor_optimizer.param_groups for p in g["params"]} == \
        {id(p) for n, p in worker.actor_module.named_parameters() if n in trainable}

    before = {n: p.detach().clone() for n, p in worker.actor_module.named_parameters()}
    data = ppo_batch(batch_size=4)
    train_step(worker, data)
    changed = {n for n, p in worker.actor_module.named_parameters() if not torch.equal(p, before[n])}
    assert changed and changed <= trainable and any(".lora_B." in n for n in changed)

    # the reference with adapters disabled is exactly a separate base model's, while the actor has moved
    base = ActorRolloutRefWorker(actor_rollout_ref_config(model_dir, use_kl_loss=True), role="ref",
                                 plan=cpu_plan(model_dir))
    base.init_model()
    ref = worker.compute_ref_log_prob(data).batch["ref_log_prob"]
    torch.testing.assert_close(ref, base.compute_ref_log_prob(data).batch["ref_log_prob"], rtol=1e-5, atol=1e-5)
    actor = worker.compute_log_prob(data).batch["old_log_probs"]
    assert (actor - ref).abs().max() > 1e-3
    # the adapters are back on after the reference pass
    torch.testing.assert_close(worker.compute_log_prob(data).batch["old_log_probs"], actor)

    # merged weights (the vLLM push) in a plain model give the adapter model's logits
    from transformers import AutoModelForCausalLM

    plain = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    untouched = plain.state_dict()   # a model without adapters pushes exactly its state_dict
    assert {k: v.data_ptr() for k, v in lora.inference_weights(plain)} == {k: v.data_ptr() for k, v in untouched.items()}
    merged = dict(lora.inference_weights(worker.actor_module))
    assert set(merged) == set(plain.state_dict())
    plain.load_state_dict(merged)
    torch.testing.assert_close(logits(plain), logits(worker.actor_module), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(logits(plain), logits(AutoModelForCausalLM.from_pretrained(model_dir)), atol=1e-3)

    # the built-in engine generates with the adapters live: greedy tokens equal the merged model's
    from verl.workers.rollout.hf_rollout import HFRollout

    ids = PROBE[:, :5]
    prompts = DataProto.from_dict(tensors={"input_ids": ids, "attention_mask": torch.ones_like(ids),
                                           "position_ids": torch.arange(5).expand(2, 5)},
                                  meta_info={"eos_token_id": 1000, "pad_token_id": 0, "do_sample": False})
    live = worker.generate_sequences(prompts).batch["responses"]
    reference = HFRollout(plain, worker.config.rollout, plan=worker.plan).generate_sequences(prompts)
    assert torch.equal(live, reference.batch["responses"])
    with lora.adapters_disabled(worker.actor_module):   # and they matter: the base alone answers otherwise
        assert not torch.equal(worker.generate_sequences(prompts).batch["responses"], live)


def test_save_resume_merge_round_trip(model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    from verl.model_merger.__main__ import main as merger_main

    first = lora_worker(model_dir)
    train_step(first, ppo_batch(batch_size=4, seed=1))
    folder = tmp_path / "global_step_1" / "actor"
    first.save_checkpoint(str(folder), global_step=1)
    assert json.loads((folder / "lora_train_meta.json").read_text()) == {"r": RANK, "lora_alpha": 16,
                                                                          "task_type": "CAUSAL_LM"}
    shard = torch.load(folder / "model_world_size_1_rank_0.pt")
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight" in shard
    assert "base_model.model.model.layers.0.self_attn.q_proj.base_layer.weight" in shard

    resumed = lora_worker(model_dir)
    resumed.load_checkpoint(str(folder))
    torch.testing.assert_close(logits(resumed.actor_module), logits(first.actor_module), rtol=0, atol=0)
    data = ppo_batch(batch_size=4, seed=2)
    a, b = train_step(first, data.slice(0, 4)), train_step(resumed, data.slice(0, 4))
    assert a["actor/pg_loss"] == b["actor/pg_loss"] and a["actor/grad_norm"] == b["actor/grad_norm"]
    torch.testing.assert_close(logits(resumed.actor_module), logits(first.actor_module), rtol=0, atol=0)

    target = tmp_path / "merged"
    assert merger_main(["merge", "--backend", "fsdp", "--local_dir", str(folder), "--target_dir", str(target)]) == 0
    merged = AutoModelForCausalLM.from_pretrained(str(target))
    saved = lora_worker(model_dir)
    saved.load_checkpoint(str(folder))
    torch.testing.assert_close(logits(merged), logits(saved.actor_module), rtol=1e-5, atol=1e-5)

    import peft

    adapter_dir = target / "lora_adapter"
    assert json.loads((adapter_dir / "adapter_config.json").read_text())["r"] == RANK
    reloaded = peft.PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir), str(adapter_dir))
    torch.testing.assert_close(logits(reloaded), logits(saved.actor_module), rtol=1e-5, atol=1e-5)

    # lora_adapter_path continues training from that adapter
    plan = cpu_plan(model_dir, actor_rollout_ref__model__lora_rank=RANK)
    cont = ActorRolloutRefWorker(lora_config(model_dir, lora_adapter_path=str(adapter_dir)),
                                 role="actor_rollout_ref", plan=plan)
    cont.init_model()
    torch.testing.assert_close(logits(cont.actor_module), logits(saved.actor_module), rtol=1e-5, atol=1e-5)
    assert any(p.requires_grad for n, p in cont.actor_module.named_parameters() if ".lora_B." in n)


@pytest.mark.parametrize("wrapped", [False, True], ids=["unwrapped", "fsdp2"])
def test_float16_frozen_base_on_a_float32_device_matches_float32(model_dir, wrapped):
    """The p40 plan (float32 compute) stores the frozen base in float16 and upcasts it for compute: at
    each matmul where the model runs unwrapped, on FSDP2's gather where it is wrapped (compat.always_fsdp).
    Its log-probs match the all-float32 LoRA actor's within float16's rounding of the weights (2e-3 on
    log-probs of the tiny model, whose logits are O(1))."""
    half = lora_worker(model_dir, device="p40", compat__always_fsdp=wrapped)
    assert half.plan.actor.compute_dtype == "float32" and half.plan.actor.frozen_dtype == "float16"
    assert half.plan.actor.fsdp == wrapped
    full = lora_worker(model_dir)
    assert full.plan.actor.frozen_dtype in (None, "float32")
    stored = {p.dtype for p in half.actor_module.parameters() if not p.requires_grad}
    assert stored == {torch.float16}
    assert {p.dtype for p in half.actor_module.parameters() if p.requires_grad} == {torch.float32}
    # adapters are drawn from a fixed seed: every worker (and rank, and run) starts from the same ones
    # (peft creates them in the base's dtype before they are made float32: here float16-rounded)
    init = {n: p for n, p in full.actor_module.named_parameters() if p.requires_grad}
    for name, param in half.actor_module.named_parameters():
        if param.requires_grad:
            torch.testing.assert_close(param.full_tensor() if wrapped else param, init[name], rtol=1e-3, atol=1e-4)
    data = ppo_batch(batch_size=4)
    # the same adapters in both (Adam's first step is about lr·sign(grad), so two separate updates would
    # differ wherever a gradient is near zero, whatever the precision): one update, copied over
    losses = [train_step(w, data.slice(0, 4))["actor/pg_loss"] for w in (full, half)]
    assert losses[0] == pytest.approx(losses[1], abs=2e-3)
    adapters = {n: p for n, p in full.actor_module.named_parameters() if p.requires_grad}
    with torch.no_grad():
        for name, param in half.actor_module.named_parameters():
            if param.requires_grad:   # one rank: a DTensor's local shard is the whole tensor
                (param.to_local() if wrapped else param).copy_(adapters[name])
    for method, key in (("compute_log_prob", "old_log_probs"), ("compute_ref_log_prob", "ref_log_prob")):
        got = getattr(half, method)(data).batch[key]
        want = getattr(full, method)(data).batch[key]
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, want, rtol=0, atol=2e-3)
    assert (half.compute_log_prob(data).batch["old_log_probs"] - half.compute_ref_log_prob(data).batch[
        "ref_log_prob"]).abs().max() > 1e-2   # the copied adapters are in force

    # what vLLM is pushed: the float16 base plus the float32 update, in float32 (float16 would round it away)
    from transformers import AutoModelForCausalLM

    with fsdp_utils.full_params(half.actor_module):   # as generate_sequences holds it for the push
        merged = {k: v.clone() for k, v in lora.inference_weights(half.actor_module)}   # gathered: freed on exit
    assert merged["model.layers.0.self_attn.q_proj.weight"].dtype == torch.float32
    plain = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    plain.load_state_dict({k: v.float() for k, v in merged.items()})
    torch.testing.assert_close(logits(plain), logits(half.actor_module), rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def bnb_model_dir(tmp_path_factory):
    """bitsandbytes quantizes in blocks of 64 input features: a tiny Qwen2 whose layers are that wide."""
    from verl.utils.tiny_model import build_tiny_model_dir

    return build_tiny_model_dir(str(tmp_path_factory.mktemp("bnb_model")), hidden_size=64, num_layers=2,
                                intermediate_size=128, num_heads=4, num_kv_heads=2, seed=0)


def test_qlora_base_and_8bit_adamw(bnb_model_dir, tmp_path):
    """The t4 plan with `load_in_4bit` and AdamW8bit (run on this host's CPU): the base's linear layers are
    bitsandbytes NF4, the optimizer keeps 8-bit moments, only the adapters change, and the merged weights
    (the base dequantized, then W + s·B@A: what vLLM is pushed) reproduce the QLoRA model's logits up to
    its float16 matmuls (2e-2 on logits of magnitude ~1)."""
    pytest.importorskip("bitsandbytes", reason="QLoRA and 8-bit AdamW need bitsandbytes (pip install 'verl[bnb]')")
    import bitsandbytes as bnb
    from transformers import AutoModelForCausalLM

    rank = 64   # bitsandbytes keeps tensors under 4096 elements in 32 bits: 64 x 64 adapters are 8-bit
    plan = cpu_plan(bnb_model_dir, device="t4", actor_rollout_ref__model__lora_rank=rank,
                    actor_rollout_ref__model__load_in_4bit=True,
                    actor_rollout_ref__actor__optim__optimizer_impl="bitsandbytes.optim",
                    actor_rollout_ref__actor__optim__optimizer="AdamW8bit")
    if plan.actor.base_quantization != "nf4" or not plan.actor.optimizer_8bit:
        pytest.skip(f"the planner turned bitsandbytes down here: {plan.warnings}")
    cfg = lora_config(bnb_model_dir, lora_rank=rank)
    cfg.actor.checkpoint = {"save_contents": ["model", "optimizer", "extra", "hf_model"]}
    worker = ActorRolloutRefWorker(cfg, role="actor_rollout_ref", plan=plan)
    worker.init_model()
    q_proj = worker.actor_module.model.layers[0].self_attn.q_proj
    assert isinstance(q_proj.base_layer, bnb.nn.Linear4bit) and isinstance(worker.actor_optimizer, bnb.optim.AdamW8bit)

    before = {n: p.detach().clone() for n, p in worker.actor_module.named_parameters()}
    train_step(worker, ppo_batch(batch_size=4))
    changed = {n for n, p in worker.actor_module.named_parameters() if not torch.equal(p, before[n])}
    assert changed and all(".lora_" in n for n in changed)
    moments = [s["state1"] for p, s in worker.actor_optimizer.state.items() if p.numel() >= 4096]
    assert moments and all(m.dtype == torch.uint8 for m in moments)

    plain = AutoModelForCausalLM.from_pretrained(bnb_model_dir, dtype=torch.float32)
    plain.load_state_dict({k: v.float() for k, v in lora.inference_weights(worker.actor_module)})
    torch.testing.assert_close(logits(plain), logits(worker.actor_module).float(), rtol=0, atol=2e-2)
    assert not torch.allclose(logits(plain), logits(AutoModelForCausalLM.from_pretrained(bnb_model_dir)), atol=2e-2)

    # save -> resume (4-bit base, 8-bit moments) continues exactly; the merger dequantizes and merges
    from verl.model_merger.__main__ import main as merger_main

    folder = tmp_path / "global_step_1" / "actor"
    worker.save_checkpoint(str(folder), global_step=1)
    resumed = ActorRolloutRefWorker(lora_config(bnb_model_dir, lora_rank=rank), role="actor_rollout_ref", plan=plan)
    resumed.init_model()
    resumed.load_checkpoint(str(folder))
    assert merger_main(["merge", "--backend", "fsdp", "--local_dir", str(folder), "--target_dir",
                        str(tmp_path / "merged")]) == 0
    for path in (tmp_path / "merged", folder / "huggingface"):   # dense, with no quantization config
        merged = AutoModelForCausalLM.from_pretrained(str(path))
        assert type(merged.model.layers[0].self_attn.q_proj) is torch.nn.Linear
        torch.testing.assert_close(logits(merged), logits(worker.actor_module).float(), rtol=0, atol=2e-2)
    data = ppo_batch(batch_size=4, seed=3)
    a, b = train_step(worker, data.slice(0, 4)), train_step(resumed, data.slice(0, 4))
    assert a["actor/pg_loss"] == b["actor/pg_loss"] and a["actor/grad_norm"] == b["actor/grad_norm"]
    torch.testing.assert_close(logits(resumed.actor_module), logits(worker.actor_module), rtol=0, atol=0)


def test_two_rank_lora_checkpoint_merges(model_dir, tmp_path):
    """FSDP2 over two ranks splits every adapter between them; the merger joins them, and the merged
    folder (and the checkpoint's own merged `huggingface/` weights) reproduce the live model's logits."""
    from transformers import AutoModelForCausalLM

    from verl.model_merger.__main__ import main as merger_main

    run_ranks(lambda rank: [os.path.join(HERE, "lora_runner.py"), model_dir, str(tmp_path)], world=2)
    live = torch.load(tmp_path / "live_logits.pt")
    folder = tmp_path / "global_step_1" / "actor"
    shard = torch.load(folder / "model_world_size_2_rank_0.pt")
    assert shard["base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight"].shape[0] == RANK // 2
    assert merger_main(["merge", "--backend", "fsdp", "--local_dir", str(folder), "--target_dir",
                        str(tmp_path / "merged")]) == 0
    for path in (tmp_path / "merged", folder / "huggingface"):
        torch.testing.assert_close(logits(AutoModelForCausalLM.from_pretrained(str(path))), live, rtol=1e-5,
                                   atol=1e-5)
