"""fsdp_utils.place_unwrapped: a model the plan runs without FSDP2 (one device). Its input embedding adds
its gradient rows straight into `.grad` (`rows_into_grad`), so a tied embedding's backward ends holding the
`.grad` alone instead of three vocabulary matrices, with the same dense gradient.

Memory is the CPU stand-in for the allocator's peak (`benchmarks/memory_model.py`'s LiveBytes: bytes of
storages created while backward runs); the vocabulary (32,000 x 64) dominates the model, so the peak is
counted in vocabulary matrices. Gradients: float32, equal to 1e-6.
"""
import copy
import gc
import os
import sys

import pytest
import torch
import transformers

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "benchmarks"))

import memory_model  # noqa: E402

from verl.utils.fsdp_utils import place_unwrapped, rows_into_grad  # noqa: E402

VOCAB, HIDDEN = 32000, 64
VH = VOCAB * HIDDEN * 4


def _model(tied: bool) -> transformers.Qwen2ForCausalLM:
    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=1, num_attention_heads=4,
                                   num_key_value_heads=2, intermediate_size=128, tie_word_embeddings=tied)
    return transformers.Qwen2ForCausalLM(cfg)


def _backward(model, ids) -> float:
    """Peak bytes backward creates, in vocabulary matrices."""
    loss = model(input_ids=ids, logits_to_keep=8).logits.float().logsumexp(-1).sum()
    before = memory_model.resident_storages(model)
    tracker = memory_model._live_bytes_mode(set(before))
    gc.disable()
    try:
        with tracker:
            loss.backward()
    finally:
        gc.enable()
    return tracker.peak / VH


def test_a_tied_embedding_backward_holds_only_its_grad_with_the_same_gradient():
    ids = torch.randint(0, VOCAB, (1, 64), generator=torch.Generator().manual_seed(1))
    dense = _model(tied=True)
    unwrapped = place_unwrapped(copy.deepcopy(dense), "cpu")
    dense_peak, unwrapped_peak = _backward(dense, ids), _backward(unwrapped, ids)
    assert dense_peak == pytest.approx(3, abs=0.15)         # .grad, the embedding's dense gradient, their sum
    assert unwrapped_peak == pytest.approx(1, abs=0.15)     # .grad
    for (name, a), b in zip(dense.named_parameters(), unwrapped.parameters()):
        assert not b.grad.is_sparse, name
        torch.testing.assert_close(b.grad, a.grad, atol=1e-6, rtol=0)
    # a second micro-batch adds into the same .grad: the projection's gradient is the one transient matrix
    assert _backward(unwrapped, ids) == pytest.approx(1, abs=0.15)
    _backward(dense, ids)
    torch.testing.assert_close(unwrapped.get_input_embeddings().weight.grad, dense.get_input_embeddings().weight.grad,
                               atol=1e-6, rtol=0)


def test_an_untied_embedding_gets_the_same_dense_gradient_and_lookups_without_grad_are_plain():
    dense = _model(tied=False)
    model = place_unwrapped(copy.deepcopy(dense), "cpu")
    ids = torch.tensor([[1, 2, 3, 2]])
    for m in (dense, model):
        m(input_ids=ids).logits.sum().backward()
    grad = model.get_input_embeddings().weight.grad
    assert not grad.is_sparse
    torch.testing.assert_close(grad, dense.get_input_embeddings().weight.grad, atol=1e-6, rtol=0)
    with torch.no_grad():
        out = model.get_input_embeddings()(ids)
    assert out.grad_fn is None and not out.requires_grad


def test_the_padding_row_gets_no_gradient():
    reference = torch.nn.Embedding(10, 4, padding_idx=0)
    embedding = rows_into_grad(copy.deepcopy(reference))
    ids = torch.tensor([[0, 3, 0, 5, 3]])
    for e in (reference, embedding):
        (e(ids) * torch.arange(4.0)).sum().backward()
    assert embedding.weight.grad[0].abs().sum() == 0
    torch.testing.assert_close(embedding.weight.grad, reference.weight.grad, atol=0, rtol=0)


@pytest.mark.parametrize("reentrant", [True, False])
def test_activation_checkpointing_sees_the_lookup_and_gives_the_same_gradient(reentrant):
    """Reentrant checkpointing needs its input to require grad: the lookup's output does."""
    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, intermediate_size=128, tie_word_embeddings=True)
    reference = transformers.Qwen2ForCausalLM(cfg)
    ids = torch.randint(0, 1000, (2, 16), generator=torch.Generator().manual_seed(2))
    model = place_unwrapped(copy.deepcopy(reference), "cpu")
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    model.train()
    for m in (reference, model):
        m(input_ids=ids).logits.float().logsumexp(-1).sum().backward()
    for (name, a), b in zip(reference.named_parameters(), model.parameters()):
        torch.testing.assert_close(b.grad, a.grad, atol=1e-6, rtol=0, msg=name)
