"""Training-throughput changes keep the math, in float32 on CPU.

Dropping all-padding columns, token budgets counted in padded size, metrics read once per mini-batch
and the fused AdamW kernel must each give the same numbers as the path they replace. Tolerances:
1e-5 absolute against float64 for log-probs and entropies; 1e-5 between the trimmed and untrimmed
float32 paths (only the matmul shapes differ); 1e-6 between fused and per-tensor AdamW.
"""
import os
import sys

import pytest
import torch
from omegaconf import OmegaConf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from worker_setup import PROMPT_LEN, RESPONSE_LEN, actor_rollout_ref_config, cpu_plan, optim, ppo_batch, tiny_model  # noqa: E402,I001

from verl.protocol import DataProto  # noqa: E402
from verl.utils import packing  # noqa: E402
from verl.utils.packing import padding_windows  # noqa: E402
from verl.utils.seqlen_balancing import make_micro_batches, padded_micro_batches, restore_dynamic_batch  # noqa: E402
from verl.workers.actor.dp_actor import _reduce_micro_metrics  # noqa: E402
from verl.workers.fsdp_workers import ActorRolloutRefWorker, _build_optimizer  # noqa: E402

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model(str(tmp_path_factory.mktemp("tiny_qwen2")))


def _padded_batch() -> DataProto:
    """ppo_batch with every row's first 2 prompt columns and last 2 response columns turned into padding."""
    data = ppo_batch()
    mask = data.batch["attention_mask"]
    mask[:, :2] = 0
    mask[:, -2:] = 0
    data.batch["position_ids"] = (mask.cumsum(-1) - 1).clamp(min=0)
    data.batch["response_mask"] = mask[:, PROMPT_LEN:].clone()
    return data


def _float64_reference(model_dir, data: DataProto):
    """(log-probs, entropies) of the response tokens from a float64 copy of the model, untrimmed."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64, attn_implementation="sdpa")
    with torch.no_grad():
        logits = model(input_ids=data.batch["input_ids"], attention_mask=data.batch["attention_mask"],
                       position_ids=data.batch["position_ids"]).logits[:, PROMPT_LEN - 1 : -1]
    logp = torch.log_softmax(logits, dim=-1)
    entropy = -(logp.exp() * logp).sum(-1)
    return logp.gather(-1, data.batch["responses"].unsqueeze(-1)).squeeze(-1), entropy


def test_padding_windows_keep_exactly_the_columns_with_a_real_token(monkeypatch):
    monkeypatch.setattr(packing, "WIDTH_STEP", 1)   # exact windows; the rounding is tested below
    mask = torch.zeros(3, 10, dtype=torch.long)   # prompt 6 + response 4
    mask[0, 3:8] = 1
    mask[1, 4:7] = 1
    full = torch.ones(1, 10, dtype=torch.long)
    empty_response = torch.zeros(1, 10, dtype=torch.long)
    empty_response[0, 5] = 1
    assert padding_windows([mask, full, empty_response], response_length=4) == [(3, 8), (0, 10), (5, 7)]


def test_padding_windows_round_widths_up_into_the_prompt_padding():
    """Widths are multiples of WIDTH_STEP (so a run meets few shapes), widened leftwards into prompt
    padding while it lasts, and still cover every real column."""
    step = packing.WIDTH_STEP
    mask = torch.zeros(2, 4 * step, dtype=torch.long)    # prompt 3*step + response step
    mask[0, 3 * step - 5 : 3 * step + 7] = 1              # 12 real columns
    short = torch.zeros(1, 4 * step, dtype=torch.long)
    short[0, 2:3 * step + step // 2] = 1                  # almost the whole width: rounds to all of it
    (a, b), (c, d) = padding_windows([mask, short], response_length=step)
    assert (b - a) == step and a <= 3 * step - 5 and b >= 3 * step + 7
    assert (c, d) == (0, 4 * step)


def test_trimmed_forward_equals_untrimmed_and_float64(model_dir, monkeypatch):
    monkeypatch.setattr(packing, "WIDTH_STEP", 1)   # the tiny batch's exact window (rounding adds padding back)
    worker = ActorRolloutRefWorker(actor_rollout_ref_config(model_dir), role="actor_rollout", plan=cpu_plan(model_dir))
    worker.init_model()
    actor, data = worker.actor, _padded_batch()
    batch = {k: data.batch[k] for k in ("input_ids", "attention_mask", "position_ids", "responses")}
    (window,) = actor._windows([batch])
    assert window == (2, PROMPT_LEN + RESPONSE_LEN - 2)
    mask = data.batch["response_mask"].bool()
    weights = torch.randn(mask.shape, generator=torch.Generator().manual_seed(1)) * mask
    results = {}
    for name, w in (("trimmed", window), ("untrimmed", None)):
        actor.actor_module.zero_grad(set_to_none=True)
        log_probs, entropy = actor._forward_micro_batch(batch, 1.0, True, w)
        ((log_probs + 0.1 * entropy) * weights).sum().backward()
        grads = [p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad.clone()
                 for p in actor.actor_module.parameters()]
        results[name] = (log_probs.detach(), entropy.detach(), grads)
    ref_lp, ref_ent = _float64_reference(model_dir, data)
    lp, ent, grads = results["trimmed"]
    assert lp.dtype == ent.dtype == torch.float32 and lp.shape == (8, RESPONSE_LEN)
    torch.testing.assert_close(lp[mask].double(), ref_lp[mask], atol=1e-5, rtol=0)
    torch.testing.assert_close(ent[mask].double(), ref_ent[mask], atol=1e-5, rtol=0)
    assert (lp[~mask] == 0).all() and (ent[~mask] == 0).all()
    lp0, ent0, grads0 = results["untrimmed"]
    torch.testing.assert_close(lp, lp0, atol=1e-5, rtol=0)
    torch.testing.assert_close(ent, ent0, atol=1e-5, rtol=0)
    for g, g0 in zip(grads, grads0):
        torch.testing.assert_close(g, g0, atol=1e-5, rtol=1e-4)
    worker.actor_module.zero_grad(set_to_none=True)


def test_trimmed_critic_values_equal_untrimmed(model_dir, monkeypatch):
    monkeypatch.setattr(packing, "WIDTH_STEP", 1)   # the tiny batch's exact window
    from worker_setup import critic_config

    from verl.workers.fsdp_workers import CriticWorker

    worker = CriticWorker(critic_config(model_dir), plan=cpu_plan(model_dir))
    worker.init_model()
    data = _padded_batch()
    batch = {k: data.batch[k] for k in ("input_ids", "attention_mask", "position_ids", "responses")}
    (window,) = worker.critic._windows([batch])
    mask = data.batch["response_mask"].bool()
    with torch.no_grad():
        trimmed = worker.critic._forward_micro_batch(batch, window)
        untrimmed = worker.critic._forward_micro_batch(batch)
    torch.testing.assert_close(trimmed[mask], untrimmed[mask], atol=1e-5, rtol=0)
    assert (trimmed[:, -2:] == 0).all()   # slots past the window read 0


def test_padded_budget_bounds_rows_times_width_and_restores_order(monkeypatch):
    monkeypatch.setattr(packing, "WIDTH_STEP", 1)   # the grouping itself; rounded widths are bounded below
    width = 16
    prompt, response = [3, 8, 2, 8, 5, 1, 6, 2], [4, 8, 1, 2, 8, 3, 1, 1]
    mask = torch.zeros(len(prompt), width, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompt, response)):
        mask[i, 8 - p : 8] = 1
        mask[i, 8 : 8 + r] = 1
    batch = {"attention_mask": mask, "row": torch.arange(len(prompt))}
    micro, groups = padded_micro_batches(batch, max_token_len=24, response_length=8)
    assert sorted(i for g in groups for i in g) == list(range(len(prompt)))
    for m, g in zip(micro, groups):
        assert len(g) * (max(prompt[i] for i in g) + max(response[i] for i in g)) <= 24
        assert len(g) * max(response[i] for i in g) <= (24 // width) * 8   # response rows of budget // width rows
        (window,) = padding_windows([m["attention_mask"]], response_length=8)
        assert len(g) * (window[1] - window[0]) <= 24   # the forward really runs at most the budget
    assert len(groups) < len(prompt)   # short rows share passes
    restored = restore_dynamic_batch(torch.cat([m["row"] for m in micro]), groups)
    assert restored.tolist() == list(range(len(prompt)))
    # the same through the generic entry point, and a row wider than the budget is refused
    assert make_micro_batches(batch, max_token_len=24, padded_response_length=8)[1] == groups
    with pytest.raises(ValueError, match="token budget"):
        padded_micro_batches(batch, max_token_len=12, response_length=8)


def test_micro_metrics_are_summed_or_averaged_like_per_micro_batch_floats():
    micro = [{"actor/pg_loss": torch.tensor(0.5), "actor/ppo_kl": torch.tensor(0.2), "custom": 1.0},
             {"actor/pg_loss": torch.tensor(0.25), "actor/ppo_kl": torch.tensor(0.4), "custom": 3.0}]
    out = _reduce_micro_metrics(micro, ("actor/pg_loss",))
    assert out == pytest.approx({"actor/pg_loss": 0.75, "actor/ppo_kl": 0.3, "custom": 2.0})
    assert all(isinstance(v, float) for v in out.values())


def test_fused_adamw_updates_like_the_default_kernel():
    torch.manual_seed(0)
    models = [torch.nn.Linear(16, 8) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    cfg = OmegaConf.create({**optim(lr=1e-2), "weight_decay": 0.01})
    optimizers = [_build_optimizer(m, cfg, fused=f)[0] for m, f in zip(models, (False, True))]
    assert optimizers[1].defaults["fused"] is True and not optimizers[0].defaults["fused"]
    x = torch.randn(4, 16)
    for _ in range(3):
        for m, opt in zip(models, optimizers):
            m(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
    for a, b in zip(models[0].parameters(), models[1].parameters()):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def test_training_flops_count_matmuls_and_attention(model_dir):
    from transformers import AutoConfig

    from verl.compat.device.catalog import get_profile
    from verl.compat.planning.throughput import peak_flops
    from verl.utils.flops import matmul_params, training_flops

    config = AutoConfig.from_pretrained(model_dir)
    model = __import__("transformers").AutoModelForCausalLM.from_config(config)
    # every weight matrix of the layers plus one vocabulary projection (tied or not); norms and biases are not matmuls
    matrices = sum(p.numel() for n, p in model.named_parameters() if p.dim() == 2 and "embed" not in n)
    if config.tie_word_embeddings:
        matrices += config.vocab_size * config.hidden_size
    assert matmul_params(config) == matrices
    head_dim = config.hidden_size // config.num_attention_heads
    attention = 12 * (3 * 3 + 5 * 5) * head_dim * config.num_attention_heads * config.num_hidden_layers
    assert training_flops(config, [3, 5]) == 6 * matrices * 8 + attention
    assert training_flops(config, [3, 5], lm_head=False) == 6 * (matrices - config.vocab_size * config.hidden_size) * 8 \
        + attention
    assert peak_flops(get_profile("h200"), "bfloat16") == pytest.approx(989.4e12)
    assert peak_flops(get_profile("cpu"), "float32") == 0.0
