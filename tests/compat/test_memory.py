"""The memory model: exact state sizes, the shape of each term, and predictions vs measured CPU peaks.

Measurement (benchmarks/memory_model.py, shared with the GPU benchmark): the bytes of every tensor
storage created while a phase runs (a TorchDispatchMode that counts each new storage once and
uncounts it when freed) plus the storages resident at its start (weights, grads, optimizer states).
That is what `torch.cuda.max_memory_allocated` reports on a GPU, without the allocator's rounding.
"""
import dataclasses
import importlib.util
from pathlib import Path

import pytest
import torch
import transformers

from verl.compat.memory import GiB, Workload, estimate_memory, layer_activation_bytes
from verl.compat.model_spec import ModelSpec
from verl.compat.plan import RolePlan, RolloutPlan

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("memory_benchmark", ROOT / "benchmarks" / "memory_model.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)

QWEN05 = ModelSpec.from_hf_config(transformers.Qwen2Config(**bench.QWEN25_05B))
TOLERANCE = 0.15     # the project's target for predicted vs measured peak


def role(compute="bfloat16", param="float32", ckpt=False, attn="sdpa", po=False, oo=False, micro=1):
    return RolePlan(param_dtype=param, compute_dtype=compute, grad_scaler=compute == "float16",
                    attn_implementation=attn, use_remove_padding=False, gradient_checkpointing=ckpt,
                    param_offload=po, optimizer_offload=oo, micro_batch_size_per_gpu=micro,
                    forward_micro_batch_size_per_gpu=micro)


HF = RolloutPlan(name="hf", dtype="bfloat16", gpu_memory_utilization=0.0, enforce_eager=True,
                 attn_implementation="sdpa")
WL = Workload(prompt_length=256, response_length=256, rollout_batch_per_gpu=1)


def estimate(actor, critic=None, ref=None, rollout=HF, workload=WL, memory=80.0):
    return estimate_memory(QWEN05, workload, actor, rollout, critic, ref, device_memory_gb=memory)


# ----------------------------------------------------------------------------- formulas

def test_persistent_state_is_exact():
    est = estimate(role())
    terms = est.phases["actor_update"].terms
    p = QWEN05.num_params
    assert terms["actor.weights"] == pytest.approx(p * 4 / GiB)
    assert terms["actor.grads"] == pytest.approx(p * 4 / GiB)
    assert terms["actor.optimizer"] == pytest.approx(p * 8 / GiB)       # AdamW: two fp32 states


def test_half_master_weights_add_an_fp32_master_copy():
    terms = estimate(role(param="bfloat16")).phases["actor_update"].terms
    assert terms["actor.optimizer"] == pytest.approx(QWEN05.num_params * 12 / GiB)


def test_fsdp_shards_persistent_state():
    one = estimate(role()).phases["actor_update"].terms["actor.optimizer"]
    four = estimate(role(), workload=dataclasses.replace(WL, world_size=4)).phases["actor_update"].terms
    assert four["actor.optimizer"] == pytest.approx(one / 4)


def test_kv_cache_formula_and_rollout_peak():
    m = QWEN05
    per_token = 2 * m.num_layers * m.num_kv_heads * m.head_dim * 2 / GiB
    long_answer = estimate(role(), workload=Workload(16, 1024, 64)).phases["rollout"].terms
    assert long_answer["rollout.kv_cache"] == pytest.approx(per_token * 1040 * 64)    # end of decoding
    long_prompt = estimate(role(), workload=Workload(1024, 16, 64)).phases["rollout"].terms
    # prefill peak: the static decoder's cache is allocated whole (prompt + response) before prefill
    assert long_prompt["rollout.kv_cache"] == pytest.approx(per_token * 1040 * 64)
    assert long_prompt["rollout.prefill"] > long_prompt["rollout.kv_cache"]


def test_checkpointing_and_attention_kernels():
    full = layer_activation_bytes(QWEN05, "bfloat16", "float32", "sdpa", 1024)
    eager = layer_activation_bytes(QWEN05, "bfloat16", "float32", "eager", 1024)
    assert eager - full == QWEN05.num_heads * 1024 * (4 + 2)          # the saved T x T scores
    wl = Workload(512, 512, 4)
    on = estimate(role(ckpt=True, micro=4), workload=wl).phases["actor_update"].terms
    off = estimate(role(ckpt=False, micro=4), workload=wl).phases["actor_update"].terms
    assert on["activations (checkpointed)"] < off["activations"] / 5


def test_logits_dominate_with_a_large_vocab():
    wl = Workload(512, 512, 4)
    terms = estimate(role(micro=4), workload=wl).phases["log_prob"].terms
    assert terms["logits"] > 4 * terms["activations (1 layer)"]
    assert terms["logits"] >= 4 * 1024 * QWEN05.vocab_size * 2 / GiB     # B x T x V in compute dtype


def test_offloaded_roles_leave_the_device_when_idle():
    critic = role()
    kept = estimate(role(), critic=critic).phases["rollout"].terms
    off = estimate(role(), critic=dataclasses.replace(critic, param_offload=True, optimizer_offload=True))
    assert kept["critic.weights"] > 0 and kept["critic.optimizer"] > 0
    assert off.phases["rollout"].terms["critic.weights"] == 0 == off.phases["rollout"].terms["critic.optimizer"]
    assert off.phases["critic_update"].terms["critic.weights"] > 0      # back on the device when active


def test_vllm_share_and_context():
    vllm = dataclasses.replace(HF, name="vllm", gpu_memory_utilization=0.4)
    est = estimate(role(), rollout=vllm, memory=24.0)
    assert est.phases["rollout"].terms["rollout.engine share"] == pytest.approx(0.4 * 24.0)
    assert est.required_gb == pytest.approx(est.predicted_peak_gb * 1.05 + est.context_gb)
    assert estimate_memory(QWEN05, WL, role(compute="float32"), HF, device_memory_gb=32,
                           backend="cpu").context_gb == 0
    assert "<- peak" in est.table() and est.to_dict()["peak_phase"] == est.peak_phase


# ----------------------------------------------------------------------------- against measurement

TINY = {"vocab_size": 1000, "hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
            "intermediate_size": 1024, "tie_word_embeddings": False, "max_position_embeddings": 1024}
MID = {"vocab_size": 151936, "hidden_size": 896, "num_hidden_layers": 2, "num_attention_heads": 14, "num_key_value_heads": 2,
           "intermediate_size": 4864, "tie_word_embeddings": True, "max_position_embeddings": 1024}


def _check(result):
    assert result["measured"], result
    for phase, measured in result["measured"].items():
        predicted = result["predicted"][phase]
        assert abs(predicted - measured) <= TOLERANCE * measured, (phase, predicted, measured, result["memory"])


@pytest.fixture(autouse=True)
def _threads():
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_tiny_model_every_phase_fp32():
    """actor + critic + reference, float32 (the P40 plan): rollout, log-probs, values, both updates."""
    setting = {"train_batch_size": 2, "ppo_mini_batch_size": 2, "micro": 2, "log_prob_micro": 2, "prompt": 24, "response": 8,
                   "adv_estimator": "gae", "kl": True}
    result = bench.run_case("p40", setting, TINY, torch.device("cpu"))
    assert set(result["measured"]) == {"rollout", "log_prob", "ref", "values", "actor_update", "critic_update"}
    _check(result)


@pytest.mark.parametrize("device,overrides", [
    ("a100-40gb", {}),                                                          # bf16 autocast, fp32 master
    ("p40", {"actor_rollout_ref.model.enable_gradient_checkpointing": True,
             "actor_rollout_ref.model.attn_implementation": "eager"}),          # fp32, checkpointed, eager
])
def test_mid_model_large_vocab(device, overrides):
    """hidden 896, 2 layers, Qwen's 151,936-token vocab: logits and vocab gradients dominate."""
    setting = {"train_batch_size": 2, "ppo_mini_batch_size": 2, "micro": 2, "log_prob_micro": 2, "prompt": 48, "response": 32,
                   "adv_estimator": "grpo"}
    result = bench.run_case(device, setting, MID, torch.device("cpu"), overrides=overrides,
                            only=("log_prob", "actor_update"))
    _check(result)


# ----------------------------------------------------------------------------- built-in rollout chunks

def test_rollout_phase_is_one_chunk_of_linear_per_sequence_cost():
    """Generation memory is linear in the sequences generated together; the phase counts one chunk."""
    from verl.compat.memory import ENGINE_TERMS, generation_bytes_per_sequence

    actor = role(compute="float32")
    fp32 = dataclasses.replace(HF, dtype="float32")
    per_seq = generation_bytes_per_sequence(QWEN05, actor, fp32, 256, 256)
    val = Workload(256, 256, 1319)                     # the whole GSM8K test set in one call

    def engine(micro, workload=val):
        terms = estimate(actor, rollout=dataclasses.replace(fp32, micro_batch_size=micro), workload=workload)
        return sum(v for k, v in terms.phases["rollout"].terms.items() if k in ENGINE_TERMS)

    assert engine(64) == pytest.approx(64 * per_seq / GiB)
    assert engine(None) == pytest.approx(1319 * per_seq / GiB)          # no chunking: the whole batch
    assert engine(4096) == engine(None)                                 # a chunk never exceeds the batch
    # prefill dominates at 256+256 in float32: the whole KV cache (allocated before prefill) plus
    # 4H*4 + 3I*4 bytes per prompt token
    m = QWEN05
    kv = 2 * m.num_layers * m.num_kv_heads * m.head_dim * 4
    assert per_seq == 512 * kv + 256 * (4 * m.hidden_size * 4 + 3 * m.intermediate_size * 4)


def test_room_and_resident_during_rollout():
    critic = role()
    est = estimate(role(), critic=critic, memory=24.0)
    terms = est.phases["rollout"].terms
    assert est.rollout_resident_gb() == pytest.approx(
        sum(v for k, v in terms.items() if not k.startswith("rollout.")) + terms["rollout.weights"])
    room = est.room_gb(24.0)
    assert room * (1 + est.fragmentation) + est.context_gb == pytest.approx(24.0)   # inverse of required_gb


def test_chunked_generation_measured_equals_one_chunk():
    """HFRollout on 8 prompts in chunks of 2 peaks like 2 prompts alone, as predicted (CPU, float32)."""
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    from verl.protocol import DataProto
    from verl.workers.rollout import HFRollout

    model = bench.build_model(TINY, "actor", "sdpa", torch.float32, torch.device("cpu"), False)
    spec = ModelSpec.from_hf_config(transformers.Qwen2Config(**TINY))
    prompt, response = 64, 16
    cfg = OmegaConf.create({"response_length": response, "do_sample": True, "temperature": 1.0, "top_k": -1,
                            "top_p": 1.0, "seed": 0, "ignore_eos": True})

    def run(n, micro):
        ids = torch.randint(1, TINY["vocab_size"], (n, prompt))
        batch = DataProto.from_dict(
            tensors={"input_ids": ids, "attention_mask": torch.ones_like(ids),
                     "position_ids": torch.arange(prompt).expand(n, prompt).clone()},
            meta_info={"eos_token_id": [TINY["vocab_size"] + 1], "pad_token_id": 0})
        rollout = HFRollout(model, cfg, plan=SimpleNamespace(rollout=SimpleNamespace(dtype="float32",
                                                                                     micro_batch_size=micro)))
        measured = bench.measure(lambda: rollout.generate_sequences(batch), torch.device("cpu"), resident=[model])
        plan = RolloutPlan(name="hf", dtype="float32", gpu_memory_utilization=0.0, enforce_eager=True,
                           attn_implementation="sdpa", micro_batch_size=micro)
        terms = estimate_memory(spec, Workload(prompt, response, n), role(compute="float32"), plan,
                                device_memory_gb=32, backend="cpu").phases["rollout"].terms
        predicted = terms["actor.weights"] + sum(v for k, v in terms.items() if k.startswith("rollout."))
        return measured, predicted

    alone, chunked, whole = run(2, None), run(8, 2), run(8, None)
    weights = bench.resident_bytes(model) / GiB
    assert chunked[0] == pytest.approx(alone[0], rel=0.02)
    assert whole[0] - weights > 3 * (chunked[0] - weights)          # unchunked: ~4x the generation memory
    for measured, predicted in (alone, chunked, whole):
        assert abs((predicted - weights) - (measured - weights)) <= TOLERANCE * (measured - weights)


def test_benchmark_generates_in_the_plans_chunks():
    """The benchmark's rollout phase runs as the engine does: `micro_batch_size` rows per prefill
    (the last chunk holds the rest), all rows at once when unset; chunked, it peaks like one chunk."""
    from types import SimpleNamespace

    model = bench.build_model(TINY, "actor", "sdpa", torch.float32, torch.device("cpu"), False)
    setting = {"prompt": 32, "response": 4}
    prefills = []
    hook = model.register_forward_pre_hook(
        lambda m, a, kw: prefills.append(kw["input_ids"].shape[0]) if kw["input_ids"].shape[1] > 1 else None,
        with_kwargs=True)

    def run(n, micro):
        prefills.clear()
        plan = SimpleNamespace(dtype="float32", micro_batch_size=micro)
        peak = bench.measure(lambda: bench.run_generate(model, plan, n, setting, torch.device("cpu")),
                             torch.device("cpu"), resident=[model])
        return list(prefills), peak

    try:
        (five, _), (whole, _), (big, _) = run(5, 2), run(5, None), run(3, 64)
        (chunked_calls, chunked), (_, alone) = run(8, 2), run(2, None)
    finally:
        hook.remove()
    assert five == [2, 2, 1] and whole == [5] and big == [3] and chunked_calls == [2, 2, 2, 2]
    assert chunked == pytest.approx(alone, rel=0.02)
