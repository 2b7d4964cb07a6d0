"""xformers' memory-efficient attention as a transformers attention function named "xformers".

FlashAttention-2 needs sm_80. On older GPUs (V100, T4) xformers' kernels still give attention whose
memory grows linearly with sequence length, which the planner can choose when xformers' kernels
load on the device. The function plugs into transformers' attention registry, so a model loaded
with `attn_implementation="xformers"` uses it in every layer, with transformers' own SDPA-style
boolean masks (causal + padding).

The kernel is a parameter: the layout work here (head transposes, grouped-query heads, masks) is
tested on CPU against eager attention with a reference kernel, the real kernel on a GPU.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch

NAME = "xformers"

# kernel(q, k, v, bias, causal, scale, dropout) -> out; tensors in [batch, seq, heads, head_dim]
# layout; `bias` is an additive float mask [batch, heads, q_len, kv_len] or None; `causal` asks for
# a causal mask aligned to the bottom-right corner (the last query sees every key).
Kernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None, bool, float, float],
                  torch.Tensor]


def xformers_kernel(query, key, value, bias, causal, scale, dropout):
    """The real kernel: xformers.ops.memory_efficient_attention."""
    from xformers.ops import (
        LowerTriangularFromBottomRightMask,
        memory_efficient_attention,
    )

    attn_bias = LowerTriangularFromBottomRightMask() if causal else bias
    return memory_efficient_attention(query, key, value, attn_bias=attn_bias, p=dropout, scale=scale)


def _additive_bias(mask: torch.Tensor, num_heads: int, dtype: torch.dtype) -> torch.Tensor:
    """transformers' mask [b, 1|h, q, kv] (bool keep-mask or additive float) -> float bias.

    Rows with no visible key (queries at left-padding positions) are opened to every key, so the
    softmax stays finite; those positions are padding and never reach a loss. The bias is stored
    with its last dimension padded to a multiple of 8 because xformers' kernels need that row
    alignment; the returned tensor is a view of the first kv_len columns.
    """
    keep = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
    keep = keep | ~keep.any(dim=-1, keepdim=True)
    b, _, q_len, kv_len = keep.shape
    padded = torch.zeros(b, num_heads, q_len, -(-kv_len // 8) * 8, dtype=dtype, device=mask.device)
    bias = padded[..., :kv_len]
    bias.masked_fill_(~keep.expand(b, num_heads, q_len, kv_len), float("-inf"))
    return bias


def xformers_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    kernel: Kernel = xformers_kernel,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers attention-function signature: q [b, h, q, d], k/v [b, h_kv, kv, d] ->
    ([b, q, h, d], None)."""
    if kwargs.get("cu_seq_lens_q") is not None:
        raise ValueError("xformers attention here takes padded batches; packed sequences "
                         "(use_remove_padding=True) need flash_attention_2.")
    num_heads, kv_heads = query.shape[1], key.shape[1]
    if kv_heads != num_heads:   # grouped-query attention: each kv head serves a run of q heads
        key = key.repeat_interleave(num_heads // kv_heads, dim=1)
        value = value.repeat_interleave(num_heads // kv_heads, dim=1)
    q_len = query.shape[2]
    bias = None
    if attention_mask is not None:
        bias = _additive_bias(attention_mask[:, :, :, : key.shape[2]], num_heads, query.dtype)
    causal = bias is None and q_len > 1 and getattr(module, "is_causal", True)
    scale = scaling if scaling is not None else 1.0 / math.sqrt(query.shape[-1])
    out = kernel(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2),
                 bias, causal, scale, dropout)
    return out.contiguous(), None


def register_xformers_attention(kernel: Kernel = xformers_kernel) -> None:
    """Register "xformers" with transformers' attention and mask registries (idempotent).

    The mask registry gets transformers' SDPA mask builder: it yields a boolean keep-mask, or None
    when the batch is unpadded and plain causal attention is exact.
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(NAME, functools.partial(xformers_attention_forward, kernel=kernel))
    AttentionMaskInterface.register(NAME, sdpa_mask)
