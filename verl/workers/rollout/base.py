"""What every rollout engine offers the actor/rollout worker."""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch
from torch import nn

from verl.protocol import DataProto
from verl.utils.torch_functional import get_response_mask

__all__ = ["BaseRollout", "inner_module", "output_tensors", "special_tokens"]


def inner_module(module: nn.Module) -> nn.Module:
    """The HF model inside an FSDP1 wrapper (FSDP2 shards in place, so it is the module itself)."""
    return getattr(module, "_fsdp_wrapped_module", module)


def special_tokens(module: nn.Module, meta: dict, engine: str) -> tuple[list[int], int]:
    """(EOS ids, pad id) from the batch's meta_info, else from the model's config (pad defaults to EOS)."""
    hf_config = getattr(inner_module(module), "config", None)
    eos = meta.get("eos_token_id", getattr(hf_config, "eos_token_id", None))
    pad = meta.get("pad_token_id", getattr(hf_config, "pad_token_id", None))
    if eos is None:
        raise ValueError(f"{engine} needs meta_info['eos_token_id'] (int or list): set it from the tokenizer")
    eos_ids = [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]
    return eos_ids, int(eos_ids[0] if pad is None else pad)


def output_tensors(ids, mask, pos, responses, eos_ids, ignore_eos: bool) -> dict[str, torch.Tensor]:
    """Upstream's output keys from the prompts and the right-padded responses: the response mask ends
    after each row's first EOS (all ones with `ignore_eos`), positions continue the prompt's by 1, 2, ...
    on every axis ((batch, seq) positions, or a VL model's (batch, 4, seq): text then mrope axes)."""
    if ignore_eos:
        response_mask = torch.ones_like(responses, dtype=mask.dtype)
    else:
        response_mask = get_response_mask(responses, eos_token=eos_ids, dtype=mask.dtype)
    offsets = torch.arange(1, responses.shape[1] + 1, device=pos.device, dtype=pos.dtype)
    return {
        "prompts": ids,
        "responses": responses,
        "response_mask": response_mask,
        "input_ids": torch.cat([ids, responses], dim=-1),
        "attention_mask": torch.cat([mask, response_mask], dim=-1),
        "position_ids": torch.cat([pos, pos[..., -1:] + offsets], dim=-1),
    }


class BaseRollout(ABC):
    """A rollout engine turns left-padded prompts into prompt+response batches.

    Input `prompts.batch`: input_ids, attention_mask, position_ids, each (batch, prompt_length).
    Output batch: prompts, responses, response_mask, input_ids, attention_mask, position_ids, with
    responses right-padded to the configured response_length. One response per input row: the
    trainer repeats prompts `rollout.n` times before calling.
    """

    @abstractmethod
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Generate one response per row of `prompts`."""
