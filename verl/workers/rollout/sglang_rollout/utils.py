"""Upstream's `verl.workers.rollout.sglang_rollout.utils`: the weight-bucketing helper used when weights are
pushed to a rollout engine in pieces, with the DeepSeek-V4 groups of tensors that a loader fuses and must
therefore receive in one bucket. The SGLang-specific names (LoRA adapter serving, object broadcast) raise
NotImplementedError: this verl has no SGLang engine."""
from __future__ import annotations

from verl._unsupported import stand_in
from verl.workers.rollout.utils import ensure_async_iterator

__all__ = ["DEEPSEEK_V4_FUSION_GROUPS", "get_named_tensor_buckets"]

__getattr__ = stand_in(__name__, "upstream's SGLang rollout server")

# Pairs of DeepSeek-V4 attention tensors that the engine's loader concatenates into one parameter.
_V4_FUSED_PAIRS = (
    ("wq_a.weight", "wkv.weight"),
    ("wq_a.scale", "wkv.scale"),
    ("wq_a.weight_scale_inv", "wkv.weight_scale_inv"),
    ("compressor.wkv.weight", "compressor.wgate.weight"),
    ("indexer.compressor.wkv.weight", "indexer.compressor.wgate.weight"),
)
# each group: the name suffixes of its members, under either attention module name
DEEPSEEK_V4_FUSION_GROUPS = tuple(tuple(f".{attn}.{member}" for member in pair)
                                  for attn in ("self_attn", "attn") for pair in _V4_FUSED_PAIRS)


def _group_of(name: str, groups) -> tuple | None:
    """(layer prefix, group index, group size) when `name` ends with a member suffix of one group."""
    hits = [(i, suffix, len(group)) for i, group in enumerate(groups) for suffix in group if name.endswith(suffix)]
    if len(hits) > 1:
        raise ValueError(f"{name!r} is a member of several fusion groups: {hits}")
    if not hits:
        return None
    index, suffix, size = hits[0]
    return name[: -len(suffix)], index, size


async def get_named_tensor_buckets(iterable, bucket_bytes: int, fusion_groups=()):
    """Yield lists of `(name, tensor)` of at most `bucket_bytes` each (a tensor larger than that gets a bucket of
    its own), in the order given. The members of one fusion group (same layer prefix) are held back until the
    group is complete and then placed in the same bucket; a group still incomplete at the end is an error, since
    the engine's loader would wait for the missing member. A tensor that is a view is cloned, so a bucket does not
    keep its whole base buffer alive; `iterable` may be sync or async."""
    if bucket_bytes <= 0:
        raise ValueError(f"bucket_bytes must be positive, got {bucket_bytes}")
    bucket, size = [], 0
    waiting: dict = {}
    async for name, tensor in ensure_async_iterator(iterable):
        item = (name, tensor.clone() if tensor._base is not None else tensor, tensor.numel() * tensor.element_size())
        group = _group_of(name, fusion_groups)
        if group is None:
            run = [item]
        else:
            members = waiting.setdefault(group[:2], [])
            members.append(item)
            if len(members) < group[2]:
                continue
            run = waiting.pop(group[:2])
        run_bytes = sum(nbytes for _, _, nbytes in run)
        if bucket and size + run_bytes > bucket_bytes:   # cut before the run, never inside it
            yield bucket
            bucket, size = [], 0
        bucket.extend((n, t) for n, t, _ in run)
        size += run_bytes
    if waiting:
        raise ValueError(f"fusion groups never completed in this weight sync (layer prefix, group): {sorted(waiting)}")
    if bucket:
        yield bucket
