"""torch_varlen's pieces that need no GPU: the mask it asks transformers for, and that the real kernel's
wrapper traces into one graph (meta tensors reach the op's fake implementation, so this runs on CPU)."""
import pytest
import torch

from verl.compat.apply import varlen_attention


def test_no_mask_only_without_padding_and_without_a_cache():
    causal = dict(batch_size=2, q_length=6, kv_length=6, q_offset=0, kv_offset=0, attention_mask=None)
    assert varlen_attention.varlen_mask(**causal) is None   # plain causal, or packed with boundaries in kwargs
    padded = {**causal, "attention_mask": torch.tensor([[0, 1, 1, 1, 1, 1], [1] * 6], dtype=torch.bool)}
    mask = varlen_attention.varlen_mask(**padded)
    assert mask is not None and mask.shape == (2, 1, 6, 6) and not mask[0, 0, :, 0].any()
    # a decode step over a cache with a left-padded row: SDPA's mask, the padding key hidden
    decode = {**causal, "q_length": 1, "kv_length": 7, "q_offset": 6,
              "attention_mask": torch.tensor([[0] + [1] * 6, [1] * 7], dtype=torch.bool)}
    mask = varlen_attention.varlen_mask(**decode)
    assert mask.shape == (2, 1, 1, 7) and mask[0, 0, 0].tolist() == [False] + [True] * 6 and mask[1].all()
    # transformers releases that pass cache_position instead of q_length
    old_style = dict(batch_size=2, cache_position=torch.arange(6), kv_length=6, kv_offset=0, attention_mask=None)
    assert varlen_attention.varlen_mask(**old_style) is None


def test_real_kernel_wrapper_compiles_without_graph_breaks():
    pytest.importorskip("torch.nn.attention.varlen")
    q = torch.empty(100, 8, 64, device="meta", dtype=torch.bfloat16)
    kv = torch.empty(100, 2, 64, device="meta", dtype=torch.bfloat16)
    cu = torch.empty(3, dtype=torch.int32, device="meta")
    varlen_attention._varlen_options()

    def attend(q, k, v, cu):
        return varlen_attention.torch_varlen_kernel(q, k, v, cu, 60, 0.125) * 2

    explained = torch._dynamo.explain(attend)(q, kv, kv, cu)
    assert explained.graph_count == 1 and explained.graph_break_count == 0, explained.break_reasons
    assert attend(q, kv, kv, cu).shape == (100, 8, 64)   # grouped-query heads: one output per query head
