"""Split a batch into micro-batches under a token budget (`use_dynamic_bsz`), and undo the reordering.

With dynamic batch size a micro-batch is not a fixed number of sequences but as many as fit in
`max_token_len` real (unpadded) tokens, so short responses are packed many to a forward pass and long
ones few. Sequences are spread over the fewest micro-batches that respect the budget, balancing the
token count between them. Data-parallel ranks must run the same number of forward/backward passes
(every FSDP pass is a collective), so the count is agreed across the group.

The micro-batches hold the sequences out of order; `restore_dynamic_batch` puts per-sequence outputs
(log-probs, values) back in the caller's order.
"""
from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence

import torch
import torch.distributed as dist


def ceildiv(a: int, b: int) -> int:
    return -(-a // b)


def balanced_partitions(lengths: Sequence[int], k_partitions: int) -> list[list[int]]:
    """Greedy longest-first partition of indices into `k_partitions` non-empty bins of similar total.

    Each bin's indices come back sorted; bins are ordered by their first index, so the result does
    not depend on tie-breaking inside the heap.
    """
    if not 1 <= k_partitions <= len(lengths):
        raise ValueError(f"cannot split {len(lengths)} sequences into {k_partitions} non-empty micro-batches")
    order = sorted(range(len(lengths)), key=lambda i: (-int(lengths[i]), i))
    # The first k (longest) sequences seed one bin each so that no bin stays empty.
    heap = [(int(lengths[i]), b, [i]) for b, i in enumerate(order[:k_partitions])]
    heapq.heapify(heap)
    for i in order[k_partitions:]:
        total, b, members = heapq.heappop(heap)
        members.append(i)
        heapq.heappush(heap, (total + int(lengths[i]), b, members))
    bins = [sorted(members) for _, _, members in heap]
    return sorted(bins, key=lambda members: members[0])


def _agree(value: int, op, dp_group) -> int:
    """The group-wide MAX/MIN of an int (identity without a process group)."""
    if dp_group is None or not dist.is_initialized():
        return value
    t = torch.tensor([value], dtype=torch.long)
    dist.all_reduce(t, op=op, group=dp_group)
    return int(t.item())


def rearrange_micro_batches(
    batch: Mapping[str, torch.Tensor],
    max_token_len: int,
    dp_group=None,
    same_micro_num_in_dp: bool = True,
    min_num_micro_batch: int | None = None,
) -> tuple[list[dict[str, torch.Tensor]], list[list[int]]]:
    """Split `batch` (tensors sharing dim 0, with an `attention_mask`) into token-budgeted micro-batches.

    Returns the micro-batches and, for each, the original row indices it holds. The token count of a
    sequence is its number of attention-mask ones. With `dp_group`, every rank ends up with the same
    number of micro-batches (the largest any rank needs).
    """
    attention_mask = batch["attention_mask"]
    lengths = attention_mask.sum(dim=-1).tolist()
    longest = int(max(lengths))
    if longest > max_token_len:
        raise ValueError(
            f"a single sequence has {longest} tokens, more than the token budget max_token_len={max_token_len}; "
            "raise ppo_max_token_len_per_gpu / log_prob_max_token_len_per_gpu (at least prompt + response length)."
        )
    n = len(lengths)
    k = max(1, ceildiv(int(sum(lengths)), max_token_len))
    if min_num_micro_batch is not None:
        k = max(k, min_num_micro_batch)
    sync = same_micro_num_in_dp and dp_group is not None
    if sync:
        k = _agree(k, dist.ReduceOp.MAX, dp_group)
        n_min = _agree(n, dist.ReduceOp.MIN, dp_group)
    else:
        n_min = n
    while True:
        if k > n_min:
            raise ValueError(
                f"cannot form {k} non-empty micro-batches from {n_min} sequences on some rank; "
                "raise the token budget or the per-rank batch size."
            )
        partitions = balanced_partitions(lengths, k)
        fits = int(all(sum(lengths[i] for i in part) <= max_token_len for part in partitions))
        if sync:
            fits = _agree(fits, dist.ReduceOp.MIN, dp_group)
        if fits:
            break
        k += 1
    micro_batches = [index_select(batch, part) for part in partitions]
    return micro_batches, partitions


def index_select(batch: Mapping[str, torch.Tensor], indices: Sequence[int]) -> dict[str, torch.Tensor]:
    """Rows `indices` of every tensor in `batch`."""
    idx = torch.as_tensor(list(indices), dtype=torch.long)
    return {key: value.index_select(0, idx.to(value.device)) for key, value in batch.items()}


def get_reverse_idx(idx_map: Sequence[int]) -> list[int]:
    """Inverse permutation: if position i holds original row idx_map[i], row j sits at result[j]."""
    reverse = [0] * len(idx_map)
    for position, original in enumerate(idx_map):
        reverse[original] = position
    return reverse


def restore_dynamic_batch(data: torch.Tensor, batch_idx_list: Sequence[Sequence[int]]) -> torch.Tensor:
    """Reorder rows computed micro-batch by micro-batch back to the original batch order."""
    flat = [i for part in batch_idx_list for i in part]
    if len(flat) != data.shape[0]:
        raise ValueError(f"{data.shape[0]} rows but the index lists cover {len(flat)}")
    reverse = torch.as_tensor(get_reverse_idx(flat), dtype=torch.long, device=data.device)
    return data.index_select(0, reverse)


def make_micro_batches(
    batch: Mapping[str, torch.Tensor],
    *,
    micro_batch_size: int | None = None,
    max_token_len: int | None = None,
    dp_group=None,
) -> tuple[list[dict[str, torch.Tensor]], list[list[int]]]:
    """Fixed-size micro-batches (`micro_batch_size`) or token-budgeted ones (`max_token_len`).

    Both return the row indices of each micro-batch, so callers restore order the same way.
    """
    if max_token_len is not None:
        return rearrange_micro_batches(batch, max_token_len, dp_group=dp_group)
    if not micro_batch_size or micro_batch_size <= 0:
        raise ValueError("set a *_micro_batch_size_per_gpu or use_dynamic_bsz=True with a token budget")
    n = len(batch["attention_mask"])
    partitions = [list(range(s, min(s + micro_batch_size, n))) for s in range(0, n, micro_batch_size)]
    return [{k: v[p[0] : p[-1] + 1] for k, v in batch.items()} for p in partitions], partitions


def get_seqlen_balanced_partitions(seqlen_list: Sequence[int], k_partitions: int, equal_size: bool) -> list[list[int]]:
    """Upstream's name: `k_partitions` non-empty lists of indices (each sorted) with similar length sums.
    With `equal_size`, every list holds len(seqlen_list) / k_partitions indices (which must divide).
    (Upstream uses Karmarkar-Karp; this is the greedy longest-first rule: the same contract, and sums
    differ by at most the longest sequence.)"""
    if not equal_size:
        return balanced_partitions(seqlen_list, k_partitions)
    n = len(seqlen_list)
    if k_partitions < 1 or n < k_partitions or n % k_partitions:
        raise ValueError(f"equal_size needs the {n} sequences to split evenly into {k_partitions} partitions")
    size = n // k_partitions
    parts: list[list[int]] = [[] for _ in range(k_partitions)]
    totals = [0] * k_partitions
    for i in sorted(range(n), key=lambda i: (-int(seqlen_list[i]), i)):
        target = min((p for p in range(k_partitions) if len(parts[p]) < size), key=lambda p: (totals[p], p))
        parts[target].append(i)
        totals[target] += int(seqlen_list[i])
    return [sorted(part) for part in parts]


def prepare_dynamic_batch(data, max_token_len: int, dp_group=None, num_batches_divided_by: int | None = None,
                          same_micro_num_in_dp: bool = True, min_num_micro_batch: int | None = None,
                          use_dynamic_bsz_balance: bool = True):
    """A DataProto split into token-budgeted micro-batch DataProtos (non-tensor columns and meta_info
    follow their rows), plus each one's original row indices for `restore_dynamic_batch`.
    `num_batches_divided_by` makes the micro-batch count a multiple of it (e.g. pipeline stages).
    `use_dynamic_bsz_balance` is accepted for upstream's signature; micro-batches are always balanced."""
    import copy

    from verl.protocol import DataProto

    tensors = dict(data.batch.items())
    while True:
        micro, parts = rearrange_micro_batches(tensors, max_token_len, dp_group=dp_group,
                                               same_micro_num_in_dp=same_micro_num_in_dp,
                                               min_num_micro_batch=min_num_micro_batch)
        if not num_batches_divided_by or len(micro) % num_batches_divided_by == 0:
            break
        min_num_micro_batch = ceildiv(len(micro), num_batches_divided_by) * num_batches_divided_by
    batches = [DataProto.from_dict(tensors=m, non_tensors={k: v[idx] for k, v in data.non_tensor_batch.items()},
                                   meta_info=copy.deepcopy(data.meta_info)) for m, idx in zip(micro, parts)]
    return batches, parts
