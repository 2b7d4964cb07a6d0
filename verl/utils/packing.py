"""Remove padding: run a padded micro-batch as one packed row, then read the response slots back.

Given `attention_mask=None` and position ids that restart at 0 for every sequence, transformers
(checked in 4.56, 5.17 and 5.24: `masking_utils.find_packed_sequence_indices`, called from
`create_causal_mask`) treats one row as independent sequences: flash-attention kernels run
variable-length attention, sdpa and eager get a block-diagonal causal mask. The linear layers then
see only real tokens. With sdpa/eager the dense mask covers the whole packed row, so attention costs
more than in the padded batch; packing pays off with a variable-length kernel.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PackedBatch:
    input_ids: torch.Tensor        # (1, tokens): the real tokens of every sequence, one after another
    position_ids: torch.Tensor     # (1, tokens): restarting at 0 per sequence
    predictor_index: torch.Tensor  # (k,): packed columns whose output predicts a real response token
    target: torch.Tensor           # (batch, response_length) bool: the response slots those k outputs fill
    cu_seq_lens: torch.Tensor      # (sequences + 1,) int32: where each sequence starts in the packed row, then the end
    max_length: int                # the longest sequence's token count

    def attention_kwargs(self) -> dict:
        """The sequence boundaries as transformers' flash kwargs: variable-length kernels read them
        instead of deriving them from the position ids in every layer (a host sync each)."""
        return {"cu_seq_lens_q": self.cu_seq_lens, "cu_seq_lens_k": self.cu_seq_lens,
                "max_length_q": self.max_length, "max_length_k": self.max_length}


def pack(input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor,
         response_length: int) -> PackedBatch:
    """Drop the padding of (batch, seq) inputs whose last `response_length` columns are the response."""
    if position_ids.dim() != 2:
        raise ValueError(
            f"packed sequences need (batch, seq) position ids, got shape {tuple(position_ids.shape)} "
            "(multi-axis rotary positions are not supported); set use_remove_padding=False for this model."
        )
    keep = attention_mask.bool()
    has_tokens = keep.any(dim=1)
    first = keep.long().argmax(dim=1)
    starts = position_ids[has_tokens, first[has_tokens]]
    if (starts != 0).any():
        # transformers finds sequence boundaries where the position does not grow by 1; a sequence not
        # starting at 0 could silently merge with its neighbour.
        raise ValueError("packed sequences need position ids that start at 0 on each sequence's first real token")
    column = keep.flatten().cumsum(0).view(keep.shape) - 1  # packed column of every real token
    lengths = keep.sum(dim=1)[has_tokens].to(torch.int32)
    cu_seq_lens = torch.nn.functional.pad(lengths.cumsum(0, dtype=torch.int32), (1, 0))
    seq_len = keep.shape[1]
    responses = slice(seq_len - response_length, seq_len)
    predictors = slice(seq_len - response_length - 1, seq_len - 1)  # position t predicts token t+1
    target = keep[:, responses] & keep[:, predictors]
    return PackedBatch(
        input_ids=input_ids[keep].unsqueeze(0),
        position_ids=position_ids[keep].unsqueeze(0),
        predictor_index=column[:, predictors][target],  # row-major, so ascending like the packed row
        target=target,
        cu_seq_lens=cu_seq_lens,
        max_length=int(lengths.max()) if len(lengths) else 0,
    )


def unpack(values: torch.Tensor, packed: PackedBatch) -> torch.Tensor:
    """(k,) per-prediction values -> (batch, response_length), zero where no real token is predicted."""
    return values.new_zeros(packed.target.shape).masked_scatter(packed.target, values)



def padding_windows(attention_masks: list[torch.Tensor], response_length: int) -> list[tuple[int, int]]:
    """For each padded (batch, seq) micro-batch, the columns [start, end) that hold any real token.

    Prompts are left-padded and responses right-padded, so the columns before the longest prompt and
    after the longest response are padding in every row; dropping them changes no output (the mask
    hid them, and attention is causal), whatever the attention kernel. The last prompt column (it
    predicts the first response token) and the first response column are always kept. One host read
    covers all micro-batches, so the loop over them needs no further device sync for shapes.
    """
    if not attention_masks:
        return []
    seq_len = attention_masks[0].shape[1]
    prompt_length = seq_len - response_length
    column = torch.arange(seq_len, device=attention_masks[0].device)
    ends = []
    for mask in attention_masks:
        real = mask.bool().any(dim=0)
        first = torch.where(real[:prompt_length], column[:prompt_length], prompt_length - 1).min()
        last = torch.where(real[prompt_length:], column[prompt_length:], prompt_length).max()
        ends.append(torch.stack([first, last]))
    return [_round_width(min(first, prompt_length - 1), max(last + 1, prompt_length + 1), seq_len)
            for first, last in torch.stack(ends).tolist()]


# Attention (cuDNN builds a plan per shape), GEMM heuristics and compiled kernels are set up once per
# width met; trimmed widths rounded up to a multiple of this bound a run to seq_len / WIDTH_STEP shapes.
WIDTH_STEP = 64


def rounded_width(width: int, seq_len: int) -> int:
    """The columns a micro-batch of `width` real columns is run with (see WIDTH_STEP)."""
    return min(-(-width // WIDTH_STEP) * WIDTH_STEP, seq_len)


def _round_width(start: int, end: int, seq_len: int) -> tuple[int, int]:
    """Widen [start, end) to its rounded width, into the leading (prompt) padding first."""
    width = rounded_width(end - start, seq_len)
    start = max(min(start, end - width), 0)
    return start, start + width
