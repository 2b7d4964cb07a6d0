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
ATTENTION = ["sdpa", "eager"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model(str(tmp_path_factory.mktemp("tiny_qwen2")))


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
def test_transformers_runs_a_packed_row_as_independent_sequences(model_dir, attn):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation=attn)
    lengths = [5, 3, 7]
    seqs = [torch.randint(3, 60, (n,), generator=torch.Generator().manual_seed(n)) for n in lengths]
    with torch.no_grad():
        alone = torch.cat([model(input_ids=s[None], use_cache=False).logits[0] for s in seqs])
        packed = model(input_ids=torch.cat(seqs)[None], attention_mask=None, use_cache=False,
                       position_ids=torch.cat([torch.arange(n) for n in lengths])[None]).logits[0]
    torch.testing.assert_close(packed, alone, atol=1e-5, rtol=0)


def _actor(model_dir, attn, packed):
    plan = cpu_plan(model_dir, actor=role_plan(attn_implementation=attn, use_remove_padding=packed))
    plan.ref = plan.actor
    worker = ActorRolloutRefWorker(actor_rollout_ref_config(model_dir, entropy_coeff=0.01), role="actor_rollout_ref",
                                   plan=plan)
    worker.init_model()
    return worker


@pytest.mark.parametrize("attn", ATTENTION)
def test_packed_actor_matches_padded_log_probs_entropy_and_update(model_dir, attn):
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


@pytest.mark.parametrize("attn", ATTENTION)
def test_packed_critic_matches_padded_values_and_update(model_dir, attn):
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
