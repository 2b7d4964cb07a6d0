"""torch's varlen FlashAttention kernel ("torch_varlen") on a real GPU, against padded SDPA.

The CPU tests (tests/workers/test_remove_padding.py) run the layout with a reference kernel; here the
real kernel runs: the attention alone (grouped-query heads, uneven sequences, gradients), then the
actor's packed log-probs and their gradients against the padded SDPA path on the same weights, eager
and with the decoder layers compiled as the plan compiles them. bf16 tolerances: 2e-2 absolute on
attention outputs and gradients, 5e-2 on any log-prob and 5e-3 on their mean difference.
"""
import pytest
import torch
from omegaconf import OmegaConf
from transformers import Qwen2Config, Qwen2ForCausalLM

from verl.compat.apply.varlen_attention import reference_kernel, register_varlen_attention, torch_varlen_kernel
from verl.compat.device.support import varlen_kernel_available
from verl.workers.model_building import layer_compile
from verl.workers.actor.dp_actor import DataParallelPPOActor, Precision

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 0)
                       or not varlen_kernel_available()[0], reason="needs an sm_80+ GPU and torch's varlen kernel"),
]
DEVICE = "cuda"


def test_kernel_matches_per_sequence_sdpa_with_grouped_query_heads():
    torch.manual_seed(0)
    cu = torch.tensor([0, 100, 356, 357, 900], dtype=torch.int32, device=DEVICE)
    q = torch.randn(900, 8, 64, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(900, 2, 64, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(900, 2, 64, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn(900, 8, 64, device=DEVICE, dtype=torch.bfloat16)
    results = []
    for kernel in (torch_varlen_kernel, reference_kernel):
        out = kernel(q, k, v, cu, 543, 0.125)
        results.append((out.float(), *torch.autograd.grad(out, (q, k, v), grad)))
    for got, want in zip(*results):
        torch.testing.assert_close(got.float(), want.float(), atol=2e-2, rtol=2e-2)


def _models():
    torch.manual_seed(0)
    register_varlen_attention()
    padded, packed = (Qwen2ForCausalLM(Qwen2Config(
        vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, attn_implementation=attn)).to(DEVICE) for attn in ("sdpa", "torch_varlen"))
    packed.load_state_dict(padded.state_dict())
    return padded, packed


def _batch():
    prompt, response = 192, 512
    ids = torch.randint(3, 512, (4, prompt + response), device=DEVICE)
    mask = torch.ones_like(ids)
    for row, pad in enumerate((150, 0, 64, 100)):
        mask[row, :pad] = 0
    mask[2, prompt + 300:] = 0   # a response that stopped early
    return {"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0),
            "responses": ids[:, prompt:]}


def _log_probs_and_grads(model, packed: bool, batch):
    actor = DataParallelPPOActor(OmegaConf.create({"ppo_mini_batch_size": 4}), model,
                                 precision=Precision(DEVICE, torch.bfloat16), use_remove_padding=packed)
    log_probs, _ = actor._forward_micro_batch(batch, 1.0, False)
    real = batch["attention_mask"][:, -batch["responses"].shape[1]:].bool()
    model.zero_grad()
    log_probs[real].sum().backward()
    return log_probs[real].float(), {n: p.grad.float().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("compiled", [False, True])
def test_packed_actor_log_probs_and_gradients_match_padded_sdpa(compiled):
    padded, packed = _models()
    if compiled:
        layer_compile.compile_decoder_layers(packed)
    torch.manual_seed(1)
    batch = _batch()
    lp_pad, g_pad = _log_probs_and_grads(padded, False, batch)
    lp_pack, g_pack = _log_probs_and_grads(packed, True, batch)
    diff = (lp_pack - lp_pad).abs()
    assert diff.max() < 5e-2 and diff.mean() < 5e-3, (diff.max().item(), diff.mean().item())
    for name, grad in g_pad.items():
        rel = (g_pack[name] - grad).norm() / grad.norm().clamp(min=1e-6)
        assert rel < 3e-2, (name, rel.item())
