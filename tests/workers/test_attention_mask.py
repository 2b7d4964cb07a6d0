"""The mask the actor and critic hand an SDPA model: no empty rows, and the same numbers as transformers' own.

On the H200 (torch 2.11) cuDNN's SDPA backward returned NaN query gradients when a row of the mask was
empty (a left-padding query) at widths that are an odd multiple of 64 (pytorch/pytorch#196678): every
bf16 optimizer step of the quick start was skipped on a non-finite grad norm. Here, in float64 on CPU
(tolerance 1e-12): the mask the model receives has a key in every row, and log-probs, values and
gradients equal those of transformers' own mask (`model_attention_mask` bypassed).
"""
import pytest
import torch
from omegaconf import OmegaConf
from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2ForTokenClassification

from verl.utils import torch_functional
from verl.workers.actor import dp_actor
from verl.workers.actor.dp_actor import DataParallelPPOActor, Precision
from verl.workers.critic import dp_critic
from verl.workers.critic.dp_critic import DataParallelPPOCritic

PROMPT, RESPONSE = 6, 4


def _config(attn: str) -> Qwen2Config:
    return Qwen2Config(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, attn_implementation=attn, num_labels=1)


def _micro_batch() -> dict:
    """Three rows: left-padded prompts (4, 0 and 2 padding columns), one response cut short."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, 96, (3, PROMPT + RESPONSE), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :4] = 0
    mask[2, :2] = 0
    mask[1, -2:] = 0
    return {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
            "responses": ids[:, PROMPT:]}


def _masks_seen(monkeypatch) -> list:
    seen, sdpa = [], torch.nn.functional.scaled_dot_product_attention

    def spy(*args, attn_mask=None, **kwargs):
        seen.append(attn_mask)
        return sdpa(*args, attn_mask=attn_mask, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    return seen


def _bypass(monkeypatch):
    """transformers' own mask: the worker hands the model the 2D padding mask."""
    for module in (dp_actor, dp_critic):
        monkeypatch.setattr(module, "model_attention_mask", lambda model, mask: mask)


def _grads(model) -> list[torch.Tensor]:
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    return grads


def test_sdpa_mask_has_a_key_in_every_row_and_the_actor_is_unchanged(monkeypatch):
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(_config("sdpa")).double()
    actor = DataParallelPPOActor(OmegaConf.create({"ppo_mini_batch_size": 3}), model, precision=Precision("cpu"))
    batch = _micro_batch()
    seen = _masks_seen(monkeypatch)
    ours, _ = actor._forward_micro_batch(batch, 1.0, False)
    ours.sum().backward()
    ours_grads = _grads(model)
    assert seen and all(m.dtype == torch.bool and m.any(dim=-1).all() for m in seen)

    _bypass(monkeypatch)
    seen.clear()
    theirs, _ = actor._forward_micro_batch(batch, 1.0, False)
    theirs.sum().backward()
    # the case being guarded: transformers' mask leaves the left-padding queries without a key
    assert not all(m.any(dim=-1).all() for m in seen)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-12)
    for a, b in zip(ours_grads, _grads(model)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_critic_values_and_gradients_are_unchanged(monkeypatch):
    torch.manual_seed(0)
    model = Qwen2ForTokenClassification(_config("sdpa")).double().eval()   # no classifier dropout
    critic = DataParallelPPOCritic(OmegaConf.create({"ppo_mini_batch_size": 3}), model, precision=Precision("cpu"))
    batch = _micro_batch()
    ours = critic._forward_micro_batch(batch)
    ours.sum().backward()
    ours_grads = _grads(model)
    _bypass(monkeypatch)
    theirs = critic._forward_micro_batch(batch)
    theirs.sum().backward()
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-12)
    for a, b in zip(ours_grads, _grads(model)):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_only_sdpa_models_get_the_square_mask(attn):
    mask = _micro_batch()["attention_mask"]
    got = torch_functional.model_attention_mask(Qwen2ForCausalLM(_config(attn)), mask)
    if attn == "eager":
        assert got is mask
        return
    seq = mask.shape[-1]
    assert got.shape == (3, 1, seq, seq)
    causal, eye = torch.ones(seq, seq, dtype=torch.bool).tril(), torch.eye(seq, dtype=torch.bool)
    for row in range(3):
        real = mask[row].bool()
        # as transformers builds it (causal over real keys), except that a query with no key (left
        # padding) sees itself and nothing else
        left_padding = ~real & (real.cumsum(0) == 0)
        assert torch.equal(got[row, 0][~left_padding], (causal & real)[~left_padding])
        assert torch.equal(got[row, 0][left_padding], eye[left_padding])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_bf16_update_gradients_are_finite_at_an_odd_multiple_of_64_columns():
    """The case of pytorch/pytorch#196678 through the actor: bf16 autocast, SDPA's default backend
    (cuDNN on sm_90), 704 columns (11 x 64), left-padded prompts. Every gradient must be finite."""
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, attn_implementation="sdpa")
    model = Qwen2ForCausalLM(config).cuda()
    actor = DataParallelPPOActor(OmegaConf.create({"ppo_mini_batch_size": 4}), model,
                                 precision=Precision("cuda", torch.bfloat16))
    prompt, response = 192, 512
    ids = torch.randint(3, 512, (4, prompt + response), device="cuda")
    mask = torch.ones_like(ids)
    for row, pad in enumerate((150, 0, 64, 100)):
        mask[row, :pad] = 0
    batch = {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
             "responses": ids[:, prompt:]}
    log_probs, _ = actor._forward_micro_batch(batch, 1.0, False)
    log_probs.sum().backward()
    assert torch.isfinite(log_probs).all()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters())
