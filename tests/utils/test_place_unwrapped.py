"""fsdp_utils.place_unwrapped: a model the plan runs without FSDP2 (one device). A tied input embedding
gets sparse gradients, so backward holds one vocabulary matrix fewer, with the same dense gradient.

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

from verl.utils.fsdp_utils import place_unwrapped  # noqa: E402

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


def test_a_tied_embedding_backward_holds_one_vocabulary_matrix_fewer_with_the_same_gradient():
    ids = torch.randint(0, VOCAB, (1, 64), generator=torch.Generator().manual_seed(1))
    dense = _model(tied=True)
    unwrapped = place_unwrapped(copy.deepcopy(dense), "cpu")
    assert unwrapped.get_input_embeddings().sparse and not dense.get_input_embeddings().sparse
    dense_peak, unwrapped_peak = _backward(dense, ids), _backward(unwrapped, ids)
    assert dense_peak == pytest.approx(3, abs=0.1)          # .grad, the embedding's dense gradient, their sum
    assert unwrapped_peak == pytest.approx(2, abs=0.1)      # .grad and the sum
    for (name, a), b in zip(dense.named_parameters(), unwrapped.parameters()):
        assert not b.grad.is_sparse, name
        torch.testing.assert_close(b.grad, a.grad, atol=1e-6, rtol=0)


def test_an_untied_embedding_keeps_dense_gradients():
    """Its gradient would stay sparse all the way to the optimizer."""
    model = place_unwrapped(_model(tied=False), "cpu")
    assert model.get_input_embeddings().sparse is False
    model(input_ids=torch.tensor([[1, 2, 3]])).logits.sum().backward()
    assert not model.get_input_embeddings().weight.grad.is_sparse
