"""The half-precision numerics guard: forward passes in float32 and under the planned half dtype,
on a few real rows, before training starts.

Device rules say float16 is *fast* on a V100 or T4; they cannot say a given model's activations
stay inside float16's range (max 65504). A model that overflows trains on garbage, so the worker
runs this check once and, when it fails, switches the role to float32 with the returned reason.

Metric: the log-probability of each actual next token (what PPO's ratios and KL are built from),
compared over positions where both the token and its successor are real (attention_mask == 1).
The half run fails when any logit there is non-finite, when the largest absolute log-prob
difference exceeds `max_abs` nats, or when the mean exceeds `mean_abs` nats. The defaults (1.0 and
0.05) sit well above float16's rounding noise on a healthy model (~1e-2 nats on average) and well
below what an overflowing one produces; a 0.05-nat mean error is a 5% error in the PPO ratio,
a quarter of the usual 0.2 clip range.

A value model (the critic: one output per position, no vocabulary) is judged on its values
instead, at every real position: non-finite values fail, and so do differences past the same
limits measured in units of max(1, RMS of the float32 values). Returns are O(1) per sequence in
RLHF, so 0.05 is a small fraction of what the critic has to resolve.

Memory: the first batch a role sees can be the whole validation set (1,319 GSM8K prompts x 256
tokens x a 152k vocabulary is ~205 GB of float32 logits), so the guard looks at `GUARD_ROWS` rows
(`guard_sample`), runs them one at a time trimmed to their real tokens, and reduces each row's
logits to per-token numbers a slice of positions at a time before the next pass.
"""
from __future__ import annotations

from collections.abc import Mapping

import torch

from verl.compat.apply.apply_plan import dtype_name, torch_dtype

MAX_ABS_NATS = 1.0
MEAN_ABS_NATS = 0.05

GUARD_ROWS = 4
"""Rows of the first batch the guard checks. Overflow comes from the weights' scale (a layer whose
activations exceed 65504 does so on ordinary text), so any real row shows it; four prompts of
~100-250 tokens give several hundred token pairs, plenty for a stable mean against the 0.05-nat
limit, while two passes over four rows cost well under one training micro-batch. Rows run one at a
time, so the guard's memory is that of a one-row forward whatever this number is."""

LOGPROB_CHUNK = 128
"""Positions per log-softmax slice: 128 x a 152k vocabulary x 4 bytes is ~78 MB of float32,
whatever the sequence length."""

_INPUT_KEYS = ("input_ids", "attention_mask", "position_ids")
_IMAGES = "multi_modal_inputs"   # per row: a VL model's pixel_values / image_grid_thw


def _has_real_pair(attention_mask: torch.Tensor) -> torch.Tensor:
    """Per row: does it hold two consecutive real tokens (the only positions the metric compares)?"""
    valid = attention_mask.bool()
    return (valid[:, :-1] & valid[:, 1:]).any(dim=-1)


def guard_sample(batch: Mapping, rows: int = GUARD_ROWS) -> dict[str, torch.Tensor]:
    """The first `rows` rows of `batch` that hold real tokens (rows of only padding, or of one
    token, are skipped: they have nothing to compare), as a dict of the model-input tensors."""
    usable = _has_real_pair(batch["attention_mask"]).nonzero().flatten()[:rows]
    if usable.numel() == 0:
        raise ValueError("The batch has no pair of consecutive real tokens to compare.")
    index = usable.to(batch["attention_mask"].device)
    sample = {k: batch[k][index] for k in _INPUT_KEYS if k in batch.keys() and batch[k] is not None}  # noqa: SIM118
    if _IMAGES in batch.keys():   # noqa: SIM118 - a VL batch: the rows' pixel inputs, so the tower is checked too
        sample[_IMAGES] = [batch[_IMAGES][i] for i in usable.tolist()]
    return sample


def _reduce(logits: torch.Tensor, input_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per position, the number of non-finite logits [batch, seq] and, in float32,
    log p(input_ids[:, t+1] | prefix) from logits[:, t] [batch, seq-1]; computed LOGPROB_CHUNK
    positions at a time, so no float32 copy of the full-vocabulary logits is ever whole."""
    batch, seq, _ = logits.shape
    bad = torch.empty(batch, seq, dtype=torch.long, device=logits.device)
    logp = torch.empty(batch, seq - 1, dtype=torch.float32, device=logits.device)
    for start in range(0, seq, LOGPROB_CHUNK):
        end = min(start + LOGPROB_CHUNK, seq)
        part = logits[:, start:end].float()
        bad[:, start:end] = (~torch.isfinite(part)).sum(-1)
        last = min(end, seq - 1)            # the final position has no next token
        if last > start:
            part = part[:, : last - start]
            nxt = input_ids[:, start + 1 : last + 1].unsqueeze(-1)
            logp[:, start:last] = part.gather(-1, nxt).squeeze(-1) - torch.logsumexp(part, dim=-1)
    return bad, logp


class _Tally:
    """What the verdict needs, summed over rows: non-finite counts and per-token log-prob errors."""

    unit = "nats"
    what = "token log-prob"

    def __init__(self):
        self.reference_bad = 0
        self.half_bad = 0
        self.diffs: list[torch.Tensor] = []
        self.scale = 1.0

    def add(self, reference, half, attention_mask: torch.Tensor) -> None:
        """`reference` and `half` are `_reduce` results for the same rows."""
        valid = attention_mask.bool()
        self.reference_bad += int(reference[0][valid].sum())
        self.half_bad += int(half[0][valid].sum())
        pairs = valid[:, :-1] & valid[:, 1:]
        self.diffs.append((reference[1] - half[1]).abs()[pairs])

    @staticmethod
    def reduce(output: torch.Tensor, inputs: Mapping):
        """What `add` needs of one forward's logits (never the full-vocabulary float32 copy)."""
        return _reduce(output, inputs["input_ids"])

    def verdict(self, dtype: str, max_abs: float, mean_abs: float) -> tuple[bool, str]:
        if self.reference_bad:
            raise ValueError("The float32 reference forward itself produced non-finite logits; the "
                             "model or batch is broken, not the half-precision run.")
        if self.half_bad:
            return False, (f"{dtype} forward produced {self.half_bad} non-finite logits on a real batch "
                           f"(activations overflow {dtype}); using float32")
        diff = torch.cat(self.diffs) if self.diffs else torch.empty(0)
        if diff.numel() == 0:
            raise ValueError("The batch has no pair of consecutive real tokens to compare.")
        worst, mean = float(diff.max()), float(diff.mean())
        max_abs, mean_abs = max_abs * self.scale, mean_abs * self.scale
        summary = (f"{self.what} |{dtype} - float32|: max {worst:.3g} {self.unit} (limit {max_abs:.3g}), "
                   f"mean {mean:.3g} (limit {mean_abs:.3g}) over {diff.numel()} tokens")
        if worst > max_abs or mean > mean_abs:
            return False, f"{summary}; using float32"
        return True, summary


class _ValueTally(_Tally):
    """The same verdict for a value model: its one output per position, at every real position,
    with the limits scaled by max(1, RMS of the float32 values)."""

    unit = "value units"
    what = "value"

    def __init__(self):
        super().__init__()
        self.squares, self.count = 0.0, 0

    @staticmethod
    def reduce(output: torch.Tensor, inputs: Mapping) -> torch.Tensor:
        return output[..., 0].float()

    def add(self, reference: torch.Tensor, half: torch.Tensor, attention_mask: torch.Tensor) -> None:
        valid = attention_mask.bool()
        ref, hlf = reference[valid], half[valid]
        self.reference_bad += int((~torch.isfinite(ref)).sum())
        self.half_bad += int((~torch.isfinite(hlf)).sum())
        self.diffs.append((ref - hlf).abs())
        if torch.isfinite(ref).all():
            self.squares += float((ref.double() ** 2).sum())
            self.count += ref.numel()
        self.scale = max(1.0, (self.squares / max(self.count, 1)) ** 0.5)


def compare_logits(reference: torch.Tensor, half: torch.Tensor, input_ids: torch.Tensor,
                   attention_mask: torch.Tensor, dtype: str = "float16", *,
                   max_abs: float = MAX_ABS_NATS, mean_abs: float = MEAN_ABS_NATS) -> tuple[bool, str]:
    """Judge half-precision logits against float32 ones for the same batch; (ok, reason)."""
    tally = _Tally()
    tally.add(_reduce(reference, input_ids), _reduce(half, input_ids), attention_mask)
    return tally.verdict(dtype, max_abs, mean_abs)


def _real_span(row: Mapping, index: int) -> dict[str, torch.Tensor]:
    """Row `index` as a batch of one, cut to its first..last real token. Position ids are kept
    (made from the untrimmed row when absent), so the cut changes no logit at a real token."""
    mask = row["attention_mask"][index]
    real = mask.nonzero().flatten()
    first, last = int(real[0]), int(real[-1]) + 1
    positions = row.get("position_ids")
    if positions is None:
        positions = torch.arange(mask.shape[-1], device=mask.device)
    else:
        positions = positions[index]
    positions = positions[..., first:last].unsqueeze(0)
    inputs = {
        "input_ids": row["input_ids"][index, first:last].unsqueeze(0),
        "attention_mask": mask[first:last].unsqueeze(0),
        # a VL model's (1, 4, seq) positions go in as (4, 1, seq), with the row's pixels
        "position_ids": positions.transpose(0, 1) if positions.dim() == 3 else positions,
    }
    if row.get(_IMAGES) is not None:
        inputs.update({k: v.to(mask.device) for k, v in (row[_IMAGES][index] or {}).items()})
    return inputs


@torch.no_grad()
def check_half_precision(model: torch.nn.Module, batch: Mapping, compute_dtype: str | torch.dtype, *,
                         max_abs: float = MAX_ABS_NATS,
                         mean_abs: float = MEAN_ABS_NATS) -> tuple[bool, str]:
    """Forward each row of `batch` (input_ids, attention_mask, optional position_ids) through `model`
    in float32 and under autocast to `compute_dtype`; (ok, reason). Two passes per row that holds
    a real token, so pass `guard_sample(batch)` rather than a whole batch; it runs on the batch's
    device (the worker's). `model` must hold
    float32 weights (the master copy), otherwise both passes would run in the half dtype and
    prove nothing."""
    dtype = torch_dtype(compute_dtype)
    name = dtype_name(dtype)
    # frozen half-precision weights that compute in float32 outside autocast (verl.workers.model_building.frozen_weights)
    # give a real float32 pass too
    upcast = getattr(model, "_verl_frozen_compute_dtype", None) == torch.float32
    params = [p for p in model.parameters() if p.is_floating_point() and not (upcast and not p.requires_grad)]
    if any(p.dtype != torch.float32 for p in params):
        raise ValueError("check_half_precision needs the model's float32 master weights; got "
                         f"{sorted({str(p.dtype) for p in params})}.")
    rows = {k: batch[k] for k in (*_INPUT_KEYS, _IMAGES) if k in batch.keys() and batch[k] is not None}  # noqa: SIM118
    # The inputs' device, not the weights': offloaded FSDP shards live in host memory between passes.
    device = rows["input_ids"].device
    tally: _Tally | None = None
    was_training = model.training
    model.eval()
    try:
        for index in range(rows["input_ids"].shape[0]):
            if not bool(rows["attention_mask"][index].any()):
                continue
            inputs = _real_span(rows, index)
            with torch.autocast(device.type, enabled=False):
                logits = model(**inputs, use_cache=False).logits
            if tally is None:   # one output per position: a value model (critic), not a language model
                tally = _ValueTally() if logits.shape[-1] == 1 else _Tally()
            reference = tally.reduce(logits, inputs)
            del logits
            with torch.autocast(device.type, dtype=dtype):
                half = tally.reduce(model(**inputs, use_cache=False).logits, inputs)
            tally.add(reference, half, inputs["attention_mask"])
    finally:
        model.train(was_training)
    if tally is None:
        raise ValueError("The batch has no pair of consecutive real tokens to compare.")
    return tally.verdict(name, max_abs, mean_abs)
