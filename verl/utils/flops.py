"""Model FLOPs utilisation of an update: the FLOPs a pass over some sequences needs, over the time it took.

The count is the usual dense-transformer estimate: 6 x (matmul parameters) per token for forward and
backward, plus 12 x seq_len^2 x head_dim x heads per layer per sequence for the attention scores and
their use. The embedding lookup is free, but the vocabulary projection is a matmul, so it is counted
once whether or not its weight is tied to the embedding. The device's peak rate comes from the compat
plan's device profile (`verl.compat.planning.throughput.peak_flops`), never from the device.
"""
from __future__ import annotations

from collections.abc import Sequence


def _language_config(config):
    """A vision-language config's language model (its `text_config`), else the config itself: the counts
    here are the decoder's (a vision tower's work is left out of MFU)."""
    return getattr(config, "text_config", None) or config


def matmul_params(config) -> int:
    """Parameters that take part in a matmul per token: every layer's projections plus the LM head."""
    config = _language_config(config)
    hidden = config.hidden_size
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    attention = hidden * head_dim * (heads + 2 * kv_heads) + heads * head_dim * hidden
    mlp = 3 * hidden * config.intermediate_size
    return config.num_hidden_layers * (attention + mlp) + config.vocab_size * hidden


def training_flops(config, seq_lens: Sequence[int], lm_head: bool = True) -> float:
    """Forward + backward FLOPs of one pass over sequences of these lengths.

    `lm_head=False` leaves the vocabulary projection out (a value model has a 1-wide head instead).
    """
    config = _language_config(config)
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    params = matmul_params(config) - (0 if lm_head else config.vocab_size * config.hidden_size)
    tokens = sum(seq_lens)
    squares = sum(s * s for s in seq_lens)
    return 6.0 * params * tokens + 12.0 * squares * head_dim * heads * config.num_hidden_layers

