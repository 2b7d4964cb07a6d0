"""PyTorch's own variable-length FlashAttention kernel as a transformers attention function, "torch_varlen".

Packed micro-batches (`use_remove_padding`) feed the linear layers real tokens only; the attention
then needs a kernel that keeps the packed sequences apart. FlashAttention-2's varlen kernel does, but
the `flash_attn` package is a separate build that many machines lack. torch (2.10+) ships the same
kind of kernel for sm_80+ in half precision (`torch.nn.attention.varlen.varlen_attn`), so on those
GPUs the planner can pack without `flash_attn`.

A packed call carries the sequence boundaries as transformers' flash kwargs (`cu_seq_lens_q/k`,
`max_length_q/k`, from `verl.utils.packing`): computed once per micro-batch, not per layer.
Every other call (padded batches, a KV cache during `generate`) goes to transformers' SDPA function
with SDPA's masks, so the same loaded model serves both. The mask function returns no mask for a
call without padding and without a cache: such a call is either plain causal or packed with
boundaries in the kwargs.

The kernel is a parameter: the layout (heads, grouped-query heads, causal packing) is tested on CPU
against eager attention with a reference kernel; the real kernel on a GPU.
"""
from __future__ import annotations

import functools
import inspect
from collections.abc import Callable

import torch

from verl.compat.device.support import varlen_kernel_available

NAME = "torch_varlen"

# kernel(q, k, v, cu_seq_lens, max_length, scale) -> out, causal within each sequence; q (tokens,
# heads, head_dim), k/v (tokens, kv_heads, head_dim); cu_seq_lens int32 (sequences + 1,).
Kernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int, float], torch.Tensor]


def torch_varlen_kernel(query, key, value, cu_seq_lens, max_length, scale):
    """The real kernel: torch.nn.attention.varlen.varlen_attn, causal as this torch release spells it."""
    from torch.nn.attention.varlen import varlen_attn

    gqa, causal_kwargs = _varlen_options()
    if key.shape[1] != query.shape[1] and not gqa:
        # releases before enable_gqa take equal head counts: one copy of each kv head per query head
        key = key.repeat_interleave(query.shape[1] // key.shape[1], dim=1)
        value = value.repeat_interleave(query.shape[1] // value.shape[1], dim=1)
    extra = {"enable_gqa": True} if gqa and key.shape[1] != query.shape[1] else {}
    return varlen_attn(query, key, value, cu_seq_lens, cu_seq_lens, max_length, max_length, scale=scale,
                       **causal_kwargs, **extra)


_OPTIONS: tuple[bool, dict] | None = None


def _varlen_options() -> tuple[bool, dict]:
    """(takes enable_gqa, the causal keyword) of this torch's varlen_attn, read once: inside a compiled
    layer the kernel then sees constants, not a signature lookup."""
    global _OPTIONS
    if _OPTIONS is None:
        from torch.nn.attention.varlen import varlen_attn

        params = inspect.signature(varlen_attn).parameters
        # torch 2.10 has is_causal; later releases a (left, right) window, (-1, 0) being causal
        causal = {"is_causal": True} if "is_causal" in params else {"window_size": (-1, 0)}
        _OPTIONS = ("enable_gqa" in params, causal)
    return _OPTIONS


def reference_kernel(query, key, value, cu_seq_lens, max_length, scale):
    """Per-sequence causal SDPA: what the varlen kernel computes, for CPU tests of the layout."""
    if key.shape[1] != query.shape[1]:
        key = key.repeat_interleave(query.shape[1] // key.shape[1], dim=1)
        value = value.repeat_interleave(query.shape[1] // value.shape[1], dim=1)
    bounds = cu_seq_lens.tolist()
    outs = []
    for start, end in zip(bounds[:-1], bounds[1:]):
        qs, ks, vs = (t[start:end].transpose(0, 1) for t in (query, key, value))
        outs.append(torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale)
                    .transpose(0, 1))
    return torch.cat(outs)


def varlen_attention_forward(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                             kernel: Kernel = torch_varlen_kernel, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers attention-function signature: q [b, h, q, d], k/v [b, h_kv, kv, d] ->
    ([b, q, h, d], None). Packed rows (cu_seq_lens_q given) go to `kernel`, the rest to SDPA."""
    cu_seq_lens = kwargs.get("cu_seq_lens_q")
    if cu_seq_lens is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    if query.shape[0] != 1 or attention_mask is not None or dropout or kwargs.get("sliding_window"):
        raise ValueError("torch_varlen attention takes one packed row with no mask, no dropout and no sliding "
                         f"window (got batch {query.shape[0]}, mask {attention_mask is not None}, dropout "
                         f"{dropout}, sliding_window {kwargs.get('sliding_window')}); use sdpa for this model")
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    # (1, heads, tokens, head_dim) -> (tokens, heads, head_dim): views, last dimension contiguous
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))
    device = query.device.type
    if torch.is_autocast_enabled(device):
        # a custom op is outside autocast's lists (SDPA is on them): rotary embeddings in float32 hand
        # over float32 q/k, which the half-precision kernel refuses
        dtype = torch.get_autocast_dtype(device)
        q, k, v = (t.to(dtype) for t in (q, k, v))
    out = kernel(q, k, v, cu_seq_lens, int(kwargs["max_length_q"]), scale)
    return out.unsqueeze(0), None


def varlen_mask(*args, **kwargs):
    """SDPA's mask, except none at all for a call without padding or cache (causal, or packed)."""
    from transformers.masking_utils import sdpa_mask

    kv_length = kwargs.get("kv_length")
    q_length = kwargs.get("q_length")
    if q_length is None and kwargs.get("cache_position") is not None:   # transformers before q_length
        q_length = kwargs["cache_position"].shape[0]
    if (kwargs.get("attention_mask") is None and q_length == kv_length and not kwargs.get("kv_offset")
            and not kwargs.get("q_offset") and not kwargs.get("local_size")):
        return None
    return sdpa_mask(*args, **kwargs)


def register_varlen_attention(kernel: Kernel | None = None) -> None:
    """Register "torch_varlen" with transformers' attention and mask registries (idempotent); `kernel`
    defaults to this module's `torch_varlen_kernel` (looked up now, so a test can swap it)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    if kernel is None:
        kernel = torch_varlen_kernel
        if varlen_kernel_available()[0]:
            _varlen_options()   # read the signature now, outside any compiled region
    AttentionInterface.register(NAME, functools.partial(varlen_attention_forward, kernel=kernel))
    AttentionMaskInterface.register(NAME, varlen_mask)
