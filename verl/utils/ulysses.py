"""Ulysses sequence parallelism: the sequence of each micro-batch split over a group of `sp` ranks.

Each rank of a sequence-parallel (SP) group runs the model on its 1/sp slice of the sequence, so it
holds 1/sp of the activations. Everything but attention works token by token; attention needs the
whole sequence, so around it the ranks exchange data (all-to-all): query/key/value go from
(all heads, my slice of the sequence) to (my 1/sp of the heads, the whole sequence), the model's own
attention kernel runs on that, and its output goes back the same way.

The exchange is installed as a transformers attention function named "ulysses_<kernel>" that wraps
the planned kernel. Outside a `sharded(...)` block it is the kernel itself, so the same loaded model
also generates and runs the numerics guard unsplit. Inside, the model is handed no attention mask
(its layers see only a slice); the wrapper builds the kernel's mask for the whole sequence from
what `sharded` was given: the padded batch's 2D mask, or a packed row's sequence boundaries.

SP groups are consecutive ranks ([0, sp), [sp, 2sp), ...); ranks of one group work on the same rows.
Key/value heads that `sp` does not divide are repeated first (to the least common multiple of their
count and `sp`), which keeps each query head paired with its key/value head.
"""
from __future__ import annotations

import functools
import math
import sys
from dataclasses import dataclass

import torch
import torch.distributed as dist

from verl.utils.packing import PackedBatch, pack

PREFIX = "ulysses_"

# ------------------------------------------------------------------------------------------ groups

_GROUPS: dict[int, object] = {}


def sequence_parallel_group(sp_size: int, key: str):
    """This rank's SP group of `sp_size` consecutive ranks (None for 1); `key` names the setting in errors.

    Every rank must call this with the same sizes in the same order (`new_group` is collective)."""
    if sp_size is None or int(sp_size) <= 1:
        return None
    sp_size = int(sp_size)
    world = dist.get_world_size() if dist.is_initialized() else 1
    if world % sp_size:
        raise ValueError(f"{key}={sp_size} must divide the number of ranks ({world}): set it to a divisor of "
                         "trainer.n_gpus_per_node x trainer.nnodes")
    if sp_size not in _GROUPS:
        rank, mine = dist.get_rank(), None
        for start in range(0, world, sp_size):
            group = dist.new_group(list(range(start, start + sp_size)))
            if start <= rank < start + sp_size:
                mine = group
        _GROUPS[sp_size] = mine
    return _GROUPS[sp_size]


def group_size(group) -> int:
    return 1 if group is None else dist.get_world_size(group)


# ------------------------------------------------------------------------------------ collectives


def _exchange(x: torch.Tensor, scatter_dim: int, gather_dim: int, group) -> torch.Tensor:
    """All-to-all: split `x` along `scatter_dim` (piece j to rank j), join what arrives along `gather_dim`."""
    sp = dist.get_world_size(group)
    sends = [piece.contiguous() for piece in x.chunk(sp, dim=scatter_dim)]
    receives = [torch.empty_like(sends[0]) for _ in range(sp)]
    dist.all_to_all(receives, sends, group=group)
    return torch.cat(receives, dim=gather_dim)


class _Exchange(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scatter_dim, gather_dim, group):
        ctx.dims, ctx.group = (scatter_dim, gather_dim), group
        return _exchange(x, scatter_dim, gather_dim, group)

    @staticmethod
    def backward(ctx, grad):
        scatter_dim, gather_dim = ctx.dims
        return _exchange(grad, gather_dim, scatter_dim, ctx.group), None, None, None


def exchange(x: torch.Tensor, scatter_dim: int, gather_dim: int, group) -> torch.Tensor:
    """Differentiable all-to-all (its gradient is the reverse exchange)."""
    return _Exchange.apply(x, scatter_dim, gather_dim, group)


class _GatherSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, dim, group):
        ctx.dim, ctx.group = dim, group
        pieces = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(pieces, x.contiguous(), group=group)
        return torch.cat(pieces, dim=dim)

    @staticmethod
    def backward(ctx, grad):
        # Every rank of the group computes the same loss from the gathered tensor; each back-propagates
        # only its own slice. Scaled by sp: the gradient reduction averages over all dp x sp ranks, and
        # the loss is normalised for dp of them (`global_batch_info`).
        sp, rank = dist.get_world_size(ctx.group), dist.get_rank(ctx.group)
        return grad.chunk(sp, dim=ctx.dim)[rank] * sp, None, None


def gather_sequence(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    """The group's slices of `x` joined along `dim` (rank order); differentiable."""
    return _GatherSequence.apply(x, dim, group)


def pad_to_multiple(x: torch.Tensor, dim: int, multiple: int, value=0) -> torch.Tensor:
    extra = -x.shape[dim] % multiple
    if not extra:
        return x
    shape = list(x.shape)
    shape[dim] = extra
    return torch.cat([x, x.new_full(shape, value)], dim=dim)


def local_slice(x: torch.Tensor, dim: int, group) -> torch.Tensor:
    """This rank's slice of `x` along `dim` (whose size the group size divides)."""
    return x.chunk(dist.get_world_size(group), dim=dim)[dist.get_rank(group)]


def share_rows(data, group):
    """The rows of every rank of `group` (its members' DataProto chunks joined in rank order), and
    this rank's slice of them: the worker group hands each rank 1/world of a batch, and the ranks of
    one SP group must work on the same rows."""
    if group is None:
        return data, slice(None)
    from verl.protocol import DataProto

    parts: list = [None] * dist.get_world_size(group)
    dist.all_gather_object(parts, data, group=group)
    start = sum(len(p) for p in parts[: dist.get_rank(group)])
    return DataProto.concat(parts), slice(start, start + len(data))


# ------------------------------------------------------------------------------- the model's inputs


@dataclass
class SplitMicroBatch:
    """One micro-batch laid out for a split forward: the whole (padded) sequence, the layout its attention
    needs, and where the response's predicting positions are in the gathered outputs."""

    input_ids: torch.Tensor        # (rows, length): length a multiple of sp; one packed row, or padded rows
    position_ids: torch.Tensor
    shard: Shard
    flash_kwargs: dict             # a packed row's boundaries for variable-length kernels
    packed: PackedBatch | None     # the packed row's mapping back to response slots
    columns: slice | None          # padded rows: gathered columns that predict the kept response tokens
    end: int | None                # padded rows: the window's end column in the micro-batch

    def model_inputs(self) -> dict:
        """This rank's slice, as the model's keyword arguments (no mask: the shard supplies it)."""
        group = self.shard.group
        return dict(input_ids=local_slice(self.input_ids, 1, group), attention_mask=None,
                    position_ids=local_slice(self.position_ids, 1, group), use_cache=False, **self.flash_kwargs)

    def next_tokens(self) -> torch.Tensor:
        """The token each local position predicts, from the whole sequence."""
        return local_slice(torch.roll(self.input_ids, -1, dims=1), 1, self.shard.group)

    def response_outputs(self, local: torch.Tensor) -> torch.Tensor:
        """Per-position outputs of this rank -> the group's, at the response's predicting positions:
        (predictions,) for a packed row, (rows, kept) for padded rows. Differentiable."""
        whole = gather_sequence(local, 1, self.shard.group)
        return whole[0, self.packed.predictor_index] if self.packed is not None else whole[:, self.columns]


def split_micro_batch(micro_batch: dict, window: tuple[int, int] | None, packed: bool, group) -> SplitMicroBatch:
    """Lay out a (rows, seq) micro-batch whose last `responses` columns are the response for a split
    forward: packed into one row (`packed`), or its `window` of padded rows; padded on the right to a
    multiple of the group size (a packed row's padding forms one more sequence of its own)."""
    sp = dist.get_world_size(group)
    response_length = micro_batch["responses"].shape[-1]
    if packed:
        row = pack(micro_batch["input_ids"], micro_batch["attention_mask"], micro_batch["position_ids"],
                   response_length)
        tokens = row.input_ids.shape[1]
        input_ids = pad_to_multiple(row.input_ids, 1, sp)
        extra = input_ids.shape[1] - tokens
        position_ids = torch.cat([row.position_ids, torch.arange(extra, device=input_ids.device)[None]], 1)
        cu_seq_lens = row.cu_seq_lens
        if extra:
            cu_seq_lens = torch.cat([cu_seq_lens, cu_seq_lens.new_tensor([tokens + extra])])
        longest = max(row.max_length, extra)
        kwargs = {"cu_seq_lens_q": cu_seq_lens, "cu_seq_lens_k": cu_seq_lens,
                  "max_length_q": longest, "max_length_k": longest}
        return SplitMicroBatch(input_ids, position_ids, sharded(group, cu_seq_lens=cu_seq_lens), kwargs, row,
                               None, None)
    seq_len = micro_batch["input_ids"].shape[1]
    start, end = window or (0, seq_len)
    kept = end - (seq_len - response_length)   # response columns inside the window
    width = end - start                        # position t predicts token t + 1
    mask = pad_to_multiple(micro_batch["attention_mask"][:, start:end], 1, sp)
    return SplitMicroBatch(pad_to_multiple(micro_batch["input_ids"][:, start:end], 1, sp),
                           pad_to_multiple(micro_batch["position_ids"][:, start:end], 1, sp),
                           sharded(group, attention_mask=mask), {}, None, slice(width - kept - 1, width - 1), end)


# ---------------------------------------------------------------------------------- the attention


class Shard:
    """The whole sequence's attention layout for model calls on sequence slices of `group`: a padded
    batch's 2D `attention_mask`, or a packed row's `cu_seq_lens`. A context manager that can be entered
    again: gradient checkpointing recomputes layers inside backward, which must run in it too."""

    def __init__(self, group, attention_mask: torch.Tensor | None = None, cu_seq_lens: torch.Tensor | None = None):
        if (attention_mask is None) == (cu_seq_lens is None):
            raise ValueError("a Shard takes either a padded batch's attention_mask or a packed row's cu_seq_lens")
        self.group, self.attention_mask, self.cu_seq_lens = group, attention_mask, cu_seq_lens
        self._previous: list = []

    def __enter__(self):
        global _ACTIVE
        self._previous.append(_ACTIVE)
        _ACTIVE = self
        return self

    def __exit__(self, *exc):
        global _ACTIVE
        _ACTIVE = self._previous.pop()


_ACTIVE: Shard | None = None


def sharded(group, attention_mask: torch.Tensor | None = None, cu_seq_lens: torch.Tensor | None = None) -> Shard:
    """Model calls inside run on sequence slices of `group` (see `Shard`)."""
    return Shard(group, attention_mask, cu_seq_lens)


def _keep_mask(shard: Shard, seq: int, device) -> torch.Tensor:
    """(batch, 1, seq, seq) bool: causal, within a sequence; a query with no key keeps itself (no NaN)."""
    column = torch.arange(seq, device=device)
    causal = column[None, :] <= column[:, None]
    if shard.cu_seq_lens is not None:
        segment = torch.bucketize(column, shard.cu_seq_lens.to(device)[1:-1], right=True)
        keep = causal & (segment[None, :] == segment[:, None])
        return keep[None, None]
    keys = shard.attention_mask.to(device=device, dtype=torch.bool)
    keep = causal[None] & keys[:, None, :]
    return (keep | torch.eye(seq, dtype=torch.bool, device=device))[:, None]


def _kernel_mask(shard: Shard, inner: str, seq: int, dtype: torch.dtype, device):
    """The mask `inner` takes for the whole sequence: variable-length kernels read a packed row's
    boundaries from the call's keyword arguments and a padded batch's 2D mask; the others a 4D mask
    (eager: additive)."""
    variable_length = inner.startswith("flash") or inner == "torch_varlen"
    if shard.cu_seq_lens is not None and variable_length:
        return None
    if shard.attention_mask is not None and inner.startswith("flash"):
        return shard.attention_mask
    keep = _keep_mask(shard, seq, device)
    if inner == "eager":
        return torch.zeros(keep.shape, dtype=dtype, device=device).masked_fill_(~keep, torch.finfo(dtype).min)
    return keep


class _KeyValueGroups:
    """The attention module seen by the kernel, with the key/value grouping after repetition."""

    def __init__(self, module, groups: int):
        self._module = module
        self.num_key_value_groups = groups

    def __getattr__(self, name):
        return getattr(self._module, name)


def _kernel(module, inner: str):
    if inner == "eager":   # transformers keeps eager attention in each model's own module
        return sys.modules[type(module).__module__].eager_attention_forward
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return ALL_ATTENTION_FUNCTIONS[inner]


def ulysses_attention(module, query, key, value, attention_mask, *, inner: str, **kwargs):
    """transformers' attention-function signature (q [b, h, s, d], k/v [b, h_kv, s, d] -> [b, s, h, d])."""
    kernel = _kernel(module, inner)
    shard = _ACTIVE
    if shard is None:
        return kernel(module, query, key, value, attention_mask, **kwargs)
    group, sp = shard.group, dist.get_world_size(shard.group)
    heads, kv_heads = query.shape[1], key.shape[1]
    repeat = math.lcm(kv_heads, sp) // kv_heads
    if repeat > 1:
        key, value = (t.repeat_interleave(repeat, dim=1) for t in (key, value))
        module = _KeyValueGroups(module, heads // (kv_heads * repeat))
    query, key, value = (exchange(t, 1, 2, group) for t in (query, key, value))
    mask = _kernel_mask(shard, inner, query.shape[2], query.dtype, query.device)
    out, _ = kernel(module, query, key, value, mask, **kwargs)
    return exchange(out, 1, 2, group), None   # [b, s, h/sp, d] -> [b, s/sp, h, d]


def _mask(*args, inner: str, **kwargs):
    """The kernel's own mask outside `sharded`; none inside (the wrapper builds the whole sequence's)."""
    if _ACTIVE is not None:
        return None
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    return ALL_MASK_ATTENTION_FUNCTIONS._global_mapping.get(inner, sdpa_mask)(*args, **kwargs)


def inner_implementation(name: str | None) -> str | None:
    """The planned kernel behind an installed Ulysses attention name (other names unchanged)."""
    return name[len(PREFIX):] if name and name.startswith(PREFIX) else name


def install(module: torch.nn.Module, sp_size: int, key: str) -> None:
    """Route `module`'s attention through the exchange (sp_size > 1); `key` names the setting in errors."""
    if sp_size <= 1:
        return
    config = module.config
    heads = int(getattr(config, "num_attention_heads", 0) or 0)
    if not heads or heads % sp_size:
        raise ValueError(f"{key}={sp_size} must divide the model's num_attention_heads ({heads}): each rank of a "
                         "sequence-parallel group computes attention for an equal share of the heads")
    inner = inner_implementation(config._attn_implementation) or "eager"
    name = PREFIX + inner
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(name, functools.partial(ulysses_attention, inner=inner))
    AttentionMaskInterface.register(name, functools.partial(_mask, inner=inner))
    config._attn_implementation = name
