"""Packed sequences (use_remove_padding) against the padded path, on CPU with sdpa and eager attention.

transformers turns one row with position ids restarting at 0 (and no attention mask) into
independent sequences (`masking_utils.find_packed_sequence_indices` -> block-diagonal causal mask).
Tolerance: 1e-5 absolute; packing only changes which float32 rows share a matmul.
"""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from worker_setup import (  # noqa: E402
    actor_rollout_ref_config,
    cpu_plan,
    critic_config,
    ppo_batch,
    role_plan,
    tiny_model,
)

from verl.utils.packing import pack, unpack  # noqa: E402
from verl.workers.fsdp_workers import ActorRolloutRefWorker, CriticWorker  # noqa: E402

torch.set_num_threads(1)
# torch_varlen runs here with its reference kernel (per-sequence causal SDPA): the layout, the
# sequence boundaries and the SDPA fallback are this code's; the real kernel is tested on a GPU
# (tests/workers/test_varlen_gpu.py).
ATTENTION = ["sdpa", "eager", "torch_varlen"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model(str(tmp_path_factory.mktemp("tiny_qwen2")))


@pytest.fixture(autouse=True)
def varlen_reference_kernel(monkeypatch):
    """torch_varlen with the reference kernel, counting packed calls (the test sees the kernel ran)."""
    from verl.compat.apply import varlen_attention

    calls = []

    def kernel(q, k, v, cu_seq_lens, max_length, scale):
        calls.append((q.shape[0], cu_seq_lens.tolist(), max_length))
        return varlen_attention.reference_kernel(q, k, v, cu_seq_lens, max_length, scale)

    monkeypatch.setattr(varlen_attention, "torch_varlen_kernel", kernel)
    varlen_attention.register_varlen_attention()
    yield calls


def test_pack_keeps_real_tokens_and_maps_predictions_to_response_slots():
    # two sequences, prompt 3 + response 2: row 0 left-padded by 1, row 1 with its last response token padded
    ids = torch.tensor([[0, 11, 12, 13, 14], [21, 22, 23, 24, 0]])
    mask = torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 1, 0]])
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    packed = pack(ids, mask, pos, response_length=2)
    assert packed.input_ids.tolist() == [[11, 12, 13, 14, 21, 22, 23, 24]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 0, 1, 2, 3]]
    assert packed.target.tolist() == [[True, True], [True, False]]
    assert packed.predictor_index.tolist() == [1, 2, 6]   # tokens 12, 13 predict 13, 14; token 23 predicts 24
    assert unpack(torch.tensor([1.0, 2.0, 3.0]), packed).tolist() == [[1.0, 2.0], [3.0, 0.0]]


def test_pack_refuses_positions_that_would_merge_sequences():
    ids = torch.ones(2, 4, dtype=torch.long)
    mask = torch.ones(2, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="start at 0"):
        pack(ids, mask, torch.arange(4).repeat(2, 1) + 1, response_length=2)


@pytest.mark.parametrize("attn", ATTENTION)
def test_transformers_runs_a_packed_row_as_independent_sequences(model_dir, attn, varlen_reference_kernel):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation=attn)
    lengths = [5, 3, 7]
    seqs = [torch.randint(3, 60, (n,), generator=torch.Generator().manual_seed(n)) for n in lengths]
    ids = torch.stack([torch.cat([torch.zeros(7 - n, dtype=torch.long), s]) for n, s in zip(lengths, seqs)])
    mask = (torch.arange(7) >= 7 - torch.tensor(lengths)[:, None]).long()
    packed = pack(ids, mask, (mask.cumsum(-1) - 1).clamp(min=0), response_length=1)
    assert packed.cu_seq_lens.tolist() == [0, 5, 8, 15] and packed.max_length == 7
    with torch.no_grad():
        alone = torch.cat([model(input_ids=s[None], use_cache=False).logits[0] for s in seqs])
        varlen_reference_kernel.clear()
        out = model(input_ids=packed.input_ids, attention_mask=None, use_cache=False,
                    position_ids=packed.position_ids, **packed.attention_kwargs()).logits[0]
    torch.testing.assert_close(out, alone, atol=1e-5, rtol=0)
    # the packed call reached the varlen kernel in both layers, with the boundaries of the three sequences
    assert varlen_reference_kernel == ([(15, [0, 5, 8, 15], 7)] * 2 if attn == "torch_varlen" else [])


def test_torch_varlen_kernel_gets_the_autocast_dtype(model_dir, varlen_reference_kernel, monkeypatch):
    """Under bf16 autocast the half-precision kernel must get bf16 q/k/v, as SDPA would (rotary
    embeddings hand over float32), and the packed logits stay those of per-sequence calls."""
    from transformers import AutoModelForCausalLM

    from verl.compat.apply import varlen_attention

    dtypes = []
    kernel = varlen_attention.torch_varlen_kernel
    monkeypatch.setattr(varlen_attention, "torch_varlen_kernel",
                        lambda q, k, v, *rest: dtypes.append({q.dtype, k.dtype, v.dtype}) or kernel(q, k, v, *rest))
    varlen_attention.register_varlen_attention()
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="torch_varlen")
    ids = torch.randint(3, 60, (2, 5), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    packed = pack(ids, mask, (mask.cumsum(-1) - 1), response_length=1)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(input_ids=packed.input_ids, attention_mask=None, position_ids=packed.position_ids,
                    use_cache=False, **packed.attention_kwargs()).logits[0]
        alone = torch.cat([model(input_ids=row[None], use_cache=False).logits[0] for row in ids])
    assert dtypes == [{torch.bfloat16}] * 2
    torch.testing.assert_close(out.float(), alone.float(), atol=5e-2, rtol=0)


def test_torch_varlen_runs_padded_batches_and_caches_through_sdpa(model_dir, varlen_reference_kernel):
    """The same loaded model serves padded batches (SDPA masks) and generate's KV cache; the kernel is not used."""
    from transformers import AutoModelForCausalLM

    models = {a: AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation=a)
              for a in ("sdpa", "torch_varlen")}
    ids = torch.randint(3, 60, (2, 6), generator=torch.Generator().manual_seed(0))
    mask = torch.tensor([[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    with torch.no_grad():
        logits = {a: m(input_ids=ids, attention_mask=mask, use_cache=False).logits for a, m in models.items()}
        tokens = {a: m.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0)
                  for a, m in models.items()}
    real = mask.bool()
    torch.testing.assert_close(logits["torch_varlen"][real], logits["sdpa"][real], atol=1e-5, rtol=0)
    assert torch.equal(tokens["torch_varlen"], tokens["sdpa"])
    assert varlen_reference_kernel == []


def _actor(model_dir, attn, packed):
    plan = cpu_plan(model_dir, actor=role_plan(attn_implementation=attn, use_remove_padding=packed))
    plan.ref = plan.actor
    worker = ActorRolloutRefWorker(actor_rollout_ref_config(model_dir, entropy_coeff=0.01), role="actor_rollout_ref",
                                   plan=plan)
    worker.init_model()
    return worker


@pytest.mark.parametrize("attn", ATTENTION)
def test_packed_actor_matches_padded_log_probs_entropy_and_update(model_dir, attn, varlen_reference_kernel):
    data = ppo_batch()
    mask = data.batch["response_mask"].bool()
    results = {}
    for packed in (False, True):
        worker = _actor(model_dir, attn, packed)
        assert worker.actor.use_remove_padding is packed and worker.ref_policy.use_remove_padding is packed
        out = worker.compute_log_prob(data)
        ref = worker.compute_ref_log_prob(data).batch["ref_log_prob"]
        batch = data.select(list(data.batch.keys()))
        batch.batch["old_log_probs"] = out.batch["old_log_probs"]
        metrics = worker.update_actor(batch).meta_info["metrics"]
        results[packed] = (out.batch["old_log_probs"], out.batch["entropys"], ref, metrics)
    (lp0, ent0, ref0, m0), (lp1, ent1, ref1, m1) = results[False], results[True]
    torch.testing.assert_close(lp1[mask], lp0[mask], atol=1e-5, rtol=0)
    torch.testing.assert_close(ent1[mask], ent0[mask], atol=1e-5, rtol=0)
    torch.testing.assert_close(ref1[mask], ref0[mask], atol=1e-5, rtol=0)
    assert (lp1[~mask] == 0).all()   # no real token predicted there: zero, as upstream's re-padding gives
    for name in ("actor/pg_loss", "actor/entropy", "actor/grad_norm"):
        assert m1[name] == pytest.approx(m0[name], rel=1e-5, abs=1e-7), name
    assert bool(varlen_reference_kernel) == (attn == "torch_varlen")   # the packed passes ran the varlen kernel


@pytest.mark.parametrize("attn", ATTENTION)
def test_packed_critic_matches_padded_values_and_update(model_dir, attn, varlen_reference_kernel):
    data = ppo_batch()
    mask = data.batch["response_mask"].bool()
    results = {}
    for packed in (False, True):
        plan = cpu_plan(model_dir, critic=role_plan(attn_implementation=attn, use_remove_padding=packed))
        worker = CriticWorker(critic_config(model_dir, ppo_mini_batch_size=4), plan=plan)
        worker.init_model()
        assert worker.critic.use_remove_padding is packed
        values = worker.compute_values(data).batch["values"]
        batch = data.select(list(data.batch.keys()))
        batch.batch["values"] = values
        results[packed] = (values, worker.update_critic(batch).meta_info["metrics"])
    (v0, m0), (v1, m1) = results[False], results[True]
    torch.testing.assert_close(v1[mask], v0[mask], atol=1e-5, rtol=0)
    for name in ("critic/vf_loss", "critic/grad_norm", "critic/vpred_mean"):
        assert m1[name] == pytest.approx(m0[name], rel=1e-5, abs=1e-7), name
    assert bool(varlen_reference_kernel) == (attn == "torch_varlen")


@pytest.mark.parametrize("packed", [True, False])
def test_the_update_backward_copies_no_logits(model_dir, packed):
    """The logits are the update's largest tensor (tokens x vocabulary); the backward must pass their gradient
    on without copying it. Indexing the model's (1, tokens, vocab) output with [0], or slicing every position of
    it, made autograd zero a tensor of that size and copy the gradient into it, once per micro-batch. What is
    left is the eager log-prob backward's one float32 working buffer per chunk (one chunk here); the compiled
    kernels read the logits as they are (tests/algos/test_torch_functional.py)."""
    from omegaconf import OmegaConf
    from torch.profiler import ProfilerActivity, profile
    from transformers import AutoModelForCausalLM

    from verl.workers.actor.dp_actor import DataParallelPPOActor, Precision

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")
    vocab = model.config.vocab_size
    actor = DataParallelPPOActor(OmegaConf.create({"ppo_mini_batch_size": 2}), model, precision=Precision("cpu"),
                                 use_remove_padding=packed)
    ids = torch.randint(3, vocab, (2, 9), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    batch = {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
             "responses": ids[:, 5:]}
    log_probs, _ = actor._forward_micro_batch(batch, 1.0, False)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        log_probs.sum().backward()
    logits_sized = [e for e in prof.key_averages(group_by_input_shape=True)
                    if any(shape and shape[-1] == vocab for shape in e.input_shapes)]
    assert [(e.key, e.input_shapes) for e in logits_sized if e.key in ("aten::zero_", "aten::fill_")] == []
    assert sum(e.count for e in logits_sized if e.key == "aten::copy_") == 1
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
