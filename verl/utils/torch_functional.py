"""Tensor helpers shared by the actor, critic, rollout and trainer.

Everything that turns logits into probabilities runs in float32 whatever dtype the model computes
in: log-probs, entropies and losses drive the PPO ratio, and half-precision rounding there biases it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

# Rows of (tokens, vocab) handled per step when upcasting logits; bounds the float32 scratch memory
# at about this many rows times the vocabulary size.
_ROWS_PER_CHUNK = 1024


# --------------------------------------------------------------------------- masked statistics


def masked_sum(values: torch.Tensor, mask: torch.Tensor, axis=None) -> torch.Tensor:
    """Sum of `values` where `mask` is non-zero; NaN/inf outside the mask cannot leak in."""
    kept = torch.where(mask.bool(), values, torch.zeros((), dtype=values.dtype, device=values.device))
    kept = kept * mask
    return kept.sum() if axis is None else kept.sum(dim=axis)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, axis=None) -> torch.Tensor:
    """Mean over masked elements; an all-masked slice gives 0 instead of NaN."""
    count = mask.sum() if axis is None else mask.sum(dim=axis)
    return masked_sum(values, mask, axis) / (count + 1e-8)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance over all masked elements (Bessel-corrected by default)."""
    mean = masked_mean(values, mask)
    var = masked_mean((values - mean) ** 2, mask)
    if unbiased:
        count = mask.sum()
        if count <= 1:
            raise ValueError(
                f"masked_var needs at least 2 unmasked elements for an unbiased variance, got {int(count)}; "
                "use a larger mini-batch or pass unbiased=False."
            )
        var = var * count / (count - 1)
    return var


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """Normalise to unit variance using statistics of the masked elements only."""
    mean = masked_mean(values, mask)
    var = masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    return whitened if shift_mean else whitened + mean


def clip_by_value(x: torch.Tensor, tensor_min: torch.Tensor, tensor_max: torch.Tensor) -> torch.Tensor:
    """Element-wise clamp with tensor bounds (used for the clipped value loss)."""
    return torch.max(torch.min(x, tensor_max), tensor_min)


# --------------------------------------------------------------------------- logits -> log-probs


class _TokenLogProb(torch.autograd.Function):
    """log softmax(logits)[label], computed in float32 chunk by chunk.

    Autograd through a plain `logits.float().log_softmax()` keeps a float32 copy of the whole
    (tokens, vocab) tensor alive until backward. Here only the input logits (already held by the
    model's graph) and one log-sum-exp per row are saved; the softmax is recomputed in chunks, in
    place in one float32 buffer per chunk (the update's backward runs this over every response
    token and the whole vocabulary, so its memory passes count). With `kernels` (compiled copies of
    `logprob_chunk_lse` / `logprob_chunk_grad`) each chunk is one fused kernel per direction that
    reads the logits in their own dtype, instead of a float32 copy and several passes.
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, labels: torch.Tensor, kernels=None) -> torch.Tensor:
        out = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
        lse = torch.empty_like(out)
        for start in range(0, logits.shape[0], _ROWS_PER_CHUNK):
            rows = slice(start, start + _ROWS_PER_CHUNK)
            label = labels[rows].unsqueeze(-1)
            if kernels is not None:
                lse[rows] = kernels.lse(logits[rows])
                out[rows] = logits[rows].gather(-1, label).squeeze(-1).float() - lse[rows]
                continue
            chunk = logits[rows].float()
            lse[rows] = torch.logsumexp(chunk, dim=-1)
            out[rows] = chunk.gather(-1, label).squeeze(-1) - lse[rows]
        ctx.save_for_backward(logits, labels, lse)
        ctx.kernels = kernels
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        logits, labels, lse = ctx.saved_tensors
        grad = torch.empty_like(logits)
        minus_one = torch.full((1, 1), -1.0, dtype=torch.float32, device=logits.device)
        for start in range(0, logits.shape[0], _ROWS_PER_CHUNK):
            rows = slice(start, start + _ROWS_PER_CHUNK)
            if ctx.kernels is not None:
                ctx.kernels.grad(grad[rows], logits[rows], labels[rows], lse[rows], grad_out[rows])
                continue
            # g * (1[j=label] - p_j) = (p_j - 1[j=label]) * (-g): one float32 buffer (a copy even for
            # float32 logits, which stay saved) turned into p in place, the result cast as it is written
            p = logits[rows].to(torch.float32, copy=True).sub_(lse[rows].unsqueeze(-1)).exp_()
            label = labels[rows].unsqueeze(-1)
            p.scatter_add_(-1, label, minus_one.expand(label.shape))
            torch.mul(p, grad_out[rows].float().neg().unsqueeze(-1), out=grad[rows])
        return grad, None, None


def logprob_chunk_lse(x: torch.Tensor) -> torch.Tensor:
    """float32 log-sum-exp per row of one chunk of logits in any float dtype: the log-prob's one
    reduction over the vocabulary (compiled, a single kernel reading the chunk in its own dtype)."""
    return torch.logsumexp(x.float(), dim=-1)


def logprob_chunk_grad(x: torch.Tensor, labels: torch.Tensor, lse: torch.Tensor, grad_out: torch.Tensor):
    """The log-prob's gradient for one chunk, in x's dtype: grad_out * (1[j=label] - exp(x_j - lse)),
    computed in float32 (compiled, a single elementwise kernel)."""
    p = torch.exp(x.float() - lse.unsqueeze(-1))
    hit = torch.arange(x.shape[-1], device=x.device) == labels.unsqueeze(-1)
    return ((hit.to(torch.float32) - p) * grad_out.float().unsqueeze(-1)).to(x.dtype)


def logprob_chunk_grad_into(out: torch.Tensor, x: torch.Tensor, labels: torch.Tensor, lse: torch.Tensor,
                            grad_out: torch.Tensor) -> None:
    """`logprob_chunk_grad` written into `out`, the chunk's rows of the gradient buffer. Compiled, the one
    kernel stores there; returning a new chunk instead costs a device-to-device copy of every chunk into
    the buffer (docs/performance.md, "Why the code does it this way")."""
    out.copy_(logprob_chunk_grad(x, labels, lse, grad_out))


@dataclass(frozen=True)
class LogProbKernels:
    """Compiled copies of the chunk functions (`compiled_log_prob_kernels`), for the plan's torch_compile."""

    lse: Callable
    grad: Callable
    entropy: Callable


def compiled_log_prob_kernels(backend: str = "inductor", compiler=None) -> LogProbKernels:
    """torch.compile'd chunk kernels (dynamic in the number of rows: the last chunk is shorter).
    `backend`: torch.compile's (tests pass one that generates no code); `compiler`: a
    `verl.utils.compile_beside.BesideCompiler` deciding when the compiled kernels run (None: always)."""
    kernels = {}
    for name, fn in (("lse", logprob_chunk_lse), ("grad", logprob_chunk_grad_into), ("entropy", entropy_chunk_stats)):
        compiled = torch.compile(fn, dynamic=True, backend=backend)
        kernels[name] = compiled if compiler is None else compiler.function(f"log-prob {name}", fn, compiled)
    return LogProbKernels(**kernels)


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor, inplace_backward: bool = True, *,
                         kernels: LogProbKernels | None = None) -> torch.Tensor:
    """Log-probability of each label under softmax(logits), in float32 (or float64 for float64 input).

    `logits` is (..., vocab) and `labels` is (...). `inplace_backward` is accepted for upstream
    call compatibility; the memory saving it stood for is always on here. `kernels`: compiled chunk
    kernels (`compiled_log_prob_kernels`), else torch's eager ops.
    """
    del inplace_backward
    if logits.dtype == torch.float64:
        return torch.log_softmax(logits, dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    lead = logits.shape[:-1]
    flat = _TokenLogProb.apply(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1).long(), kernels)
    return flat.view(lead)


def log_probs_from_logits_response(input_ids: torch.Tensor, logits: torch.Tensor, response_length: int):
    """Log-probs of the last `response_length` tokens, given logits of the full sequence."""
    response_logits = logits[:, -response_length - 1 : -1]
    return logprobs_from_logits(response_logits, input_ids[:, -response_length:])


def entropy_chunk_stats(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(log-sum-exp, E_p[x]) per row of logits `x` (any float dtype, computed in float32), from one
    exponential of the chunk.

    Entropy is their difference. The one elementwise-heavy kernel of the entropy; the actor may hand
    a compiled copy of it to `entropy_from_logits` / `logprobs_and_entropy` (which then reads the chunk
    in its own dtype, with no float32 copy of it first).
    """
    x = x.float()
    top = x.amax(dim=-1, keepdim=True)
    weights = torch.sub(x, top).exp_()            # one (rows, vocab) buffer, reused for p * x below
    total = weights.sum(dim=-1)
    lse = top.squeeze(-1) + torch.log(total)
    return lse, weights.mul_(x).sum(dim=-1) / total


class _TokenLogProbEntropy(torch.autograd.Function):
    """log softmax(logits)[label] and the entropy of softmax(logits), per row, in float32 chunks.

    One pass over each chunk gives both (the entropy's log-sum-exp is the log-prob's). Saved for
    backward: the input logits plus three floats per row; backward recomputes the softmax p per chunk:
    d logp/dx_j = 1[j=label] - p_j and dH/dx_j = -p_j (x_j - E_p[x]).
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, labels: torch.Tensor, kernel):
        lse = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
        mean = torch.empty_like(lse)
        picked = torch.empty_like(lse)
        for start in range(0, logits.shape[0], _ROWS_PER_CHUNK):
            rows = slice(start, start + _ROWS_PER_CHUNK)
            lse[rows], mean[rows] = kernel(logits[rows])
            picked[rows] = logits[rows].gather(-1, labels[rows].unsqueeze(-1)).squeeze(-1).float()
        ctx.save_for_backward(logits, labels, lse, mean)
        return picked - lse, lse - mean

    @staticmethod
    def backward(ctx, grad_logp: torch.Tensor, grad_entropy: torch.Tensor):
        logits, labels, lse, mean = ctx.saved_tensors
        grad = torch.empty_like(logits)
        for start in range(0, logits.shape[0], _ROWS_PER_CHUNK):
            rows = slice(start, start + _ROWS_PER_CHUNK)
            g_lp, g_ent = grad_logp[rows].unsqueeze(-1), grad_entropy[rows].unsqueeze(-1)
            # -p * (g_lp + g_ent * (x - mean)) in two float32 buffers: p, and g built in place over a
            # copy of x (a copy even for float32 logits, which stay saved)
            g = logits[rows].to(torch.float32, copy=True)
            p = torch.sub(g, lse[rows].unsqueeze(-1)).exp_()
            g.sub_(mean[rows].unsqueeze(-1)).mul_(-g_ent).sub_(g_lp).mul_(p)
            del p
            g.scatter_add_(-1, labels[rows].unsqueeze(-1), g_lp.float())
            grad[rows].copy_(g)                                   # cast to the logits' dtype as it is written
        return grad, None, None


def logprobs_and_entropy(logits: torch.Tensor, labels: torch.Tensor, kernel=None):
    """(log-prob of each label, entropy) under softmax(logits), both float32, from one chunked pass.

    Cheaper than `logprobs_from_logits` plus `entropy_from_logits` (one log-sum-exp, one exponential
    per chunk). `kernel` replaces `entropy_chunk_stats` (e.g. a compiled copy). Float64 input is
    computed directly in float64 (the reference path).
    """
    if logits.dtype == torch.float64:
        logp = torch.log_softmax(logits, dim=-1)
        return logp.gather(-1, labels.unsqueeze(-1)).squeeze(-1), -(logp.exp() * logp).sum(dim=-1)
    lead = logits.shape[:-1]
    logp, entropy = _TokenLogProbEntropy.apply(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1).long(),
                                               kernel or entropy_chunk_stats)
    return logp.view(lead), entropy.view(lead)


def entropy_from_logits(logits: torch.Tensor, kernel=None) -> torch.Tensor:
    """Entropy of softmax(logits) over the last dimension, in float32: lse(x) - sum(p * x).

    Computed `_ROWS_PER_CHUNK` rows at a time (forward and backward), so no float32 copy of the whole
    (tokens, vocab) tensor is ever held. Float64 input is computed directly in float64.
    """
    if logits.dtype == torch.float64:
        probs = torch.softmax(logits, dim=-1)
        return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)
    labels = torch.zeros(logits.shape[:-1], dtype=torch.long, device=logits.device)
    return logprobs_and_entropy(logits, labels, kernel)[1]


def entropy_from_logits_with_chunking(logits: torch.Tensor, chunk_size: int = 2048) -> torch.Tensor:
    """`entropy_from_logits` over the first dimension in chunks, to bound the float32 scratch memory."""
    return torch.cat([entropy_from_logits(part) for part in logits.split(chunk_size, dim=0)], dim=0)


# --------------------------------------------------------------------------- sequences and masks


def model_attention_mask(module: torch.nn.Module, attention_mask: torch.Tensor) -> torch.Tensor:
    """The attention mask to hand `module` for a padded (batch, seq) micro-batch of left-padded prompts.

    For SDPA: the (batch, 1, seq, seq) boolean mask transformers would build (causal, padding keys
    hidden), except that a query with no key at all attends to itself. Such a query (left padding) has
    no real key at or before it, so its row of the mask would be empty, and an empty row's log-sum-exp is
    -inf: cuDNN's SDPA backward on sm_90 then returns NaN query gradients at widths that are an odd
    multiple of 64 (torch 2.11, pytorch/pytorch#196678), so every bf16 optimizer step would skip on a
    non-finite grad norm. Attending to itself changes no real
    position's output (real queries never see padding keys) and no gradient (nothing reads a padding
    position's output). Other attention implementations get the 2D mask unchanged. A Ulysses wrapper
    (`verl.utils.ulysses`), called unsplit, hands the mask to the kernel it wraps.
    """
    from verl.utils.ulysses import inner_implementation

    config = getattr(module, "config", None)
    attn = inner_implementation(getattr(config, "_attn_implementation", None))
    if attn not in ("sdpa", "torch_varlen"):   # the latter pads via SDPA
        return attention_mask
    seq = attention_mask.shape[-1]
    key_real = attention_mask.bool()[:, None, None, :]
    causal = torch.ones(seq, seq, dtype=torch.bool, device=attention_mask.device).tril()
    mask = causal & key_real
    itself = torch.eye(seq, dtype=torch.bool, device=attention_mask.device)
    return mask | (itself & ~mask.any(dim=-1, keepdim=True))


def get_response_mask(response_id: torch.Tensor, eos_token: int | list[int] = 2, dtype=torch.int64) -> torch.Tensor:
    """1 for every response token up to and including the first EOS, 0 after it.

    `eos_token` may be one id or a list of ids (chat models often stop on several).
    """
    eos_ids = torch.as_tensor(eos_token, device=response_id.device).reshape(-1)
    is_eos = torch.isin(response_id, eos_ids).int()
    eos_before = is_eos.cumsum(dim=-1) - is_eos
    return (eos_before == 0).to(dtype)


def compute_position_id_with_mask(mask: torch.Tensor) -> torch.Tensor:
    """Position ids that skip padding: 0 for the first real token, left padding clamped to 0."""
    return torch.clamp(torch.cumsum(mask, dim=-1) - 1, min=0)


def pad_sequence_to_length(tensors: torch.Tensor, max_seq_len: int, pad_token_id, left_pad: bool = False):
    """Pad the last dimension up to `max_seq_len` (never truncates)."""
    missing = max_seq_len - tensors.shape[-1]
    if missing <= 0:
        return tensors
    return F.pad(tensors, (missing, 0) if left_pad else (0, missing), value=pad_token_id)


def pad_2d_list_to_length(response, pad_token_id, max_length=None) -> torch.Tensor:
    """Right-pad a list of token lists into one tensor, at least `max_length` wide."""
    width = max(len(row) for row in response)
    if max_length is not None:
        width = max(width, max_length)
    return torch.tensor([list(row) + [pad_token_id] * (width - len(row)) for row in response])


def postprocess_data(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    max_length: int,
    pad_token_id: int,
    left_pad: bool = True,
    truncation: str = "error",
):
    """Bring tokenised prompts to exactly `max_length`: pad, or truncate left/right/middle, or fail."""
    if truncation not in ("left", "right", "middle", "error"):
        raise ValueError(f"truncation must be one of left/right/middle/error, got {truncation!r}")
    length = input_ids.shape[-1]
    if length < max_length:
        input_ids = pad_sequence_to_length(input_ids, max_length, pad_token_id, left_pad=left_pad)
        attention_mask = pad_sequence_to_length(attention_mask, max_length, 0, left_pad=left_pad)
    elif length > max_length:
        if truncation == "error":
            raise ValueError(
                f"prompt is {length} tokens, longer than max_length={max_length}; raise data.max_prompt_length, "
                "set data.filter_overlong_prompts=True, or choose data.truncation=left/right/middle."
            )
        if truncation == "left":
            keep = slice(length - max_length, length)
            input_ids, attention_mask = input_ids[..., keep], attention_mask[..., keep]
        elif truncation == "right":
            input_ids, attention_mask = input_ids[..., :max_length], attention_mask[..., :max_length]
        else:
            head = max_length // 2
            tail = max_length - head
            input_ids = torch.cat([input_ids[..., :head], input_ids[..., length - tail :]], dim=-1)
            attention_mask = torch.cat([attention_mask[..., :head], attention_mask[..., length - tail :]], dim=-1)
    return input_ids, attention_mask


# --------------------------------------------------------------------------- learning-rate schedules


def get_constant_schedule_with_warmup(optimizer, num_warmup_steps: int, last_epoch: int = -1):
    """Linear warm-up from 0 to the base learning rate over `num_warmup_steps`, then constant.

    The ramp only covers steps below `num_warmup_steps` (upstream's convention: warm-up 2 gives
    0, 0.5, 1, ...), so warm-up 0 means the full rate from the very first step rather than a lost
    first update at learning rate 0.
    """

    def factor(step: int) -> float:
        if step < num_warmup_steps:
            return float(step) / float(num_warmup_steps)
        return 1.0

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor, last_epoch)


def get_cosine_schedule_with_warmup(
    optimizer,
    num_warmup_steps: int,
    num_training_steps: int,
    min_lr_ratio: float = 0.0,
    num_cycles: float = 0.5,
    last_epoch: int = -1,
    init_lr_ratio: float | None = None,
    zero_indexed_step: bool = True,
):
    """Linear warm-up from `init_lr_ratio`, then cosine decay down to `min_lr_ratio` of the base rate.

    `zero_indexed_step=False` counts the first step as 1 (torchtitan's convention).
    """
    min_lr_ratio = 0.0 if min_lr_ratio is None else min_lr_ratio
    init_lr_ratio = 0.0 if init_lr_ratio is None else init_lr_ratio
    for name, value in (("min_lr_ratio", min_lr_ratio), ("init_lr_ratio", init_lr_ratio)):
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"{name} must be within [0, 1], got {value}")

    def factor(step: int) -> float:
        if not zero_indexed_step:
            step += 1
        if step < num_warmup_steps:
            return init_lr_ratio + (1.0 - init_lr_ratio) * float(step) / float(max(1, num_warmup_steps))
        progress = float(step - num_warmup_steps) / float(max(1, num_training_steps - num_warmup_steps))
        cosine = 0.5 * (1.0 + math.cos(math.pi * num_cycles * 2.0 * progress))
        return min_lr_ratio + (1.0 - min_lr_ratio) * cosine

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor, last_epoch)
