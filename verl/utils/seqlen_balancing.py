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
from verl.utils.packing import rounded_width


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


def group_to_agree(dp_group=None):
    """The group whose ranks must agree on micro-batch counts: `dp_group`, else the default group when
    it has more than one rank (every FSDP forward is a collective over it), else None."""
    if dp_group is not None:
        return dp_group
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return dist.group.WORLD
    return None


def _agree(value: int, op, dp_group, device=None) -> int:
    """The group-wide MAX/MIN of an int (identity without a process group).

    The value travels on `device` (the batch's device), which is where the group's backend expects
    tensors (a GPU backend takes no host tensors).
    """
    if dp_group is None or not dist.is_initialized():
        return value
    t = torch.tensor([value], dtype=torch.long, device=device)
    dist.all_reduce(t, op=op, group=dp_group)
    return int(t.item())


def rearrange_micro_batches(
    batch: Mapping[str, torch.Tensor],
    max_token_len: int,
    dp_group=None,
    num_batches_divided_by: int | None = None,
    same_micro_num_in_dp: bool = True,
    min_num_micro_batch: int | None = None,
    use_dynamic_bsz_balance: bool = True,
    force_group_size: int = 1,
) -> tuple[list[dict[str, torch.Tensor]], list[list[int]]]:
    """Split `batch` (tensors sharing dim 0, with an `attention_mask`) into token-budgeted micro-batches.

    Returns the micro-batches and, for each, the original row indices it holds. The token count of a
    sequence is its number of attention-mask ones. With `dp_group`, every rank ends up with the same
    number of micro-batches (the largest any rank needs). `num_batches_divided_by` makes the count a multiple
    of it (pipeline stages); `force_group_size` keeps each run of that many consecutive rows in one micro-batch
    (pairs for reward-model training). Micro-batches are balanced by token count;
    `use_dynamic_bsz_balance` is accepted for upstream's signature.
    """
    attention_mask = batch["attention_mask"]
    row_lengths = attention_mask.sum(dim=-1).tolist()
    longest = int(max(row_lengths))
    if longest > max_token_len:
        raise ValueError(
            f"a single sequence has {longest} tokens, more than the token budget max_token_len={max_token_len}; "
            "raise ppo_max_token_len_per_gpu / log_prob_max_token_len_per_gpu (at least prompt + response length)."
        )
    if force_group_size < 1 or len(row_lengths) % force_group_size:
        raise ValueError(f"batch size {len(row_lengths)} must be divisible by force_group_size={force_group_size}")
    lengths = [int(sum(row_lengths[g:g + force_group_size])) for g in range(0, len(row_lengths), force_group_size)]
    if max(lengths) > max_token_len:
        raise ValueError(f"a group of force_group_size={force_group_size} rows has {max(lengths)} tokens, more than "
                         f"max_token_len={max_token_len}; raise the token budget")
    n = len(lengths)
    step = num_batches_divided_by or 1
    k = max(1, ceildiv(int(sum(lengths)), max_token_len))
    if min_num_micro_batch is not None:
        k = max(k, min_num_micro_batch)
    sync = same_micro_num_in_dp and dp_group is not None
    if sync:
        k = _agree(k, dist.ReduceOp.MAX, dp_group, attention_mask.device)
        n_min = _agree(n, dist.ReduceOp.MIN, dp_group, attention_mask.device)
    else:
        n_min = n
    k = ceildiv(k, step) * step
    while True:
        if k > n_min:
            raise ValueError(
                f"cannot form {k} non-empty micro-batches from {n_min} sequences (or forced groups) on some rank; "
                "raise the token budget or the per-rank batch size."
            )
        partitions = balanced_partitions(lengths, k)
        fits = int(all(sum(lengths[i] for i in part) <= max_token_len for part in partitions))
        if sync:
            fits = _agree(fits, dist.ReduceOp.MIN, dp_group, attention_mask.device)
        if fits:
            break
        k += step
    if force_group_size > 1:
        partitions = [[g * force_group_size + r for g in part for r in range(force_group_size)] for part in partitions]
    micro_batches = [index_select(batch, part) for part in partitions]
    return micro_batches, partitions


def padded_micro_batches(
    batch: Mapping[str, torch.Tensor],
    max_token_len: int,
    response_length: int,
    dp_group=None,
) -> tuple[list[dict[str, torch.Tensor]], list[list[int]]]:
    """Token-budgeted micro-batches for padded (not packed) forwards.

    A padded micro-batch costs rows x width, where width is the longest prompt plus the longest
    response in it (the columns `verl.utils.packing.padding_windows` keeps), so that is what the
    budget bounds (that width rounded as `packing.rounded_width` runs it); its response rows are also kept
    within those of budget // seq_len full rows. Rows are taken longest first and a micro-batch grows while
    its padded size fits,
    which groups similar lengths and puts many short sequences in one pass. With `dp_group`, every
    rank splits its largest micro-batches until all ranks have the same count.
    """
    mask = batch["attention_mask"]
    prompt = mask[:, : mask.shape[1] - response_length].sum(dim=-1)
    response = mask[:, mask.shape[1] - response_length :].sum(dim=-1)
    prompt_len, response_len = torch.stack([prompt, response]).tolist()
    # A row needs at least its last prompt column and one response column (the window keeps them).
    widths = [(max(p, 1), max(r, 1)) for p, r in zip(prompt_len, response_len)]
    seq_len = mask.shape[1]
    widest = max(p + r for p, r in widths)
    if widest > max_token_len:
        raise ValueError(
            f"a single sequence spans {widest} padded columns, more than the token budget max_token_len="
            f"{max_token_len}; raise ppo_max_token_len_per_gpu / log_prob_max_token_len_per_gpu (at least "
            "prompt + response length)."
        )
    # Response rows go through the LM head and the vocabulary-wide log-prob pass; they stay within what
    # budget // seq_len full sequences would bring (the memory model's assumption), however short the prompts.
    response_budget = max(max_token_len // mask.shape[1], 1) * response_length
    order = sorted(range(len(widths)), key=lambda i: (-(widths[i][0] + widths[i][1]), i))
    groups: list[list[int]] = []
    top_p = top_r = 0
    for i in order:
        p, r = widths[i]
        rows = len(groups[-1]) + 1 if groups else 0
        if groups and rows * rounded_width(max(top_p, p) + max(top_r, r), seq_len) <= max_token_len \
                and rows * max(top_r, r) <= response_budget:
            groups[-1].append(i)
            top_p, top_r = max(top_p, p), max(top_r, r)
        else:
            groups.append([i])
            top_p, top_r = p, r
    if dp_group is not None:
        k = _agree(len(groups), dist.ReduceOp.MAX, dp_group, mask.device)
        if k > _agree(len(widths), dist.ReduceOp.MIN, dp_group, mask.device):
            raise ValueError(f"cannot form {k} non-empty micro-batches on every rank; "
                             "raise the token budget or the per-rank batch size.")
        while len(groups) < k:   # splitting a micro-batch only lowers its padded size
            largest = max(range(len(groups)), key=lambda g: len(groups[g]))
            half = len(groups[largest]) // 2
            groups[largest:largest + 1] = [groups[largest][:half], groups[largest][half:]]
    return [index_select(batch, g) for g in groups], groups


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
    padded_response_length: int | None = None,
) -> tuple[list[dict[str, torch.Tensor]], list[list[int]]]:
    """Fixed-size micro-batches (`micro_batch_size`) or token-budgeted ones (`max_token_len`).

    Token budgets count real tokens for packed forwards, and padded size (`padded_micro_batches`)
    when `padded_response_length` says the forward runs on padded rows with that response width.
    Both return the row indices of each micro-batch, so callers restore order the same way.
    """
    if max_token_len is not None:
        if padded_response_length is not None:
            return padded_micro_batches(batch, max_token_len, padded_response_length, dp_group=dp_group)
        return rearrange_micro_batches(batch, max_token_len, dp_group=dp_group)
    if not micro_batch_size or micro_batch_size <= 0:
        raise ValueError("set a *_micro_batch_size_per_gpu or use_dynamic_bsz=True with a token budget")
    n = len(batch["attention_mask"])
    partitions = [list(range(s, min(s + micro_batch_size, n))) for s in range(0, n, micro_batch_size)]
    return [{k: v[p[0] : p[-1] + 1] for k, v in batch.items()} for p in partitions], partitions


def karmarkar_karp(seqlen_list: Sequence[int], k_partitions: int, equal_size: bool) -> list[list[int]]:
    """`k_partitions` lists of indices with near-equal length sums by the largest differencing method: every
    item starts as a partial solution (with `equal_size`, each run of k items in sorted order forms one, an
    item per part); the two partial solutions with the largest spread are merged, the heaviest part of one
    joined with the lightest of the other, until one is left. Each list comes back sorted, lists ordered by
    their first index."""
    n = len(seqlen_list)
    if k_partitions < 1 or n < k_partitions or (equal_size and n % k_partitions):
        raise ValueError(f"cannot split {n} sequences into {k_partitions} "
                         f"{'equal-size ' if equal_size else ''}partitions")
    order = sorted(range(n), key=lambda i: (int(seqlen_list[i]), i))
    seeds = ([order[o:o + k_partitions] for o in range(0, n, k_partitions)] if equal_size else [[i] for i in order])
    heap, counter = [], 0
    for seed in seeds:
        parts = [(int(seqlen_list[i]), [i]) for i in seed] + [(0, []) for _ in range(k_partitions - len(seed))]
        parts.sort(key=lambda p: -p[0])
        heapq.heappush(heap, (-(parts[0][0] - parts[-1][0]), counter, parts))
        counter += 1
    while len(heap) > 1:
        _, _, first = heapq.heappop(heap)
        _, _, second = heapq.heappop(heap)
        merged = [(a[0] + b[0], a[1] + b[1]) for a, b in zip(first, reversed(second))]
        merged.sort(key=lambda p: -p[0])
        heapq.heappush(heap, (-(merged[0][0] - merged[-1][0]), counter, merged))
        counter += 1
    return sorted((sorted(members) for _, members in heap[0][2]), key=lambda m: m[0] if m else n)


def greedy_partition(seqlen_list: Sequence[int], k_partitions: int, equal_size: bool) -> list[list[int]]:
    """Each item, in the given order, to the partition with the smallest sum so far (with `equal_size`, to the
    smallest among those not yet holding len / k items)."""
    n = len(seqlen_list)
    if k_partitions < 1 or (equal_size and n % k_partitions):
        raise ValueError(f"cannot split {n} sequences into {k_partitions} "
                         f"{'equal-size ' if equal_size else ''}partitions")
    cap = n // k_partitions if equal_size else n
    parts: list[list[int]] = [[] for _ in range(k_partitions)]
    totals = [0] * k_partitions
    for i, length in enumerate(seqlen_list):
        target = min((p for p in range(k_partitions) if len(parts[p]) < cap), key=lambda p: (totals[p], p))
        parts[target].append(i)
        totals[target] += int(length)
    return parts


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
    micro, parts = rearrange_micro_batches(tensors, max_token_len, dp_group=dp_group,
                                           num_batches_divided_by=num_batches_divided_by,
                                           same_micro_num_in_dp=same_micro_num_in_dp,
                                           min_num_micro_batch=min_num_micro_batch)
    batches = [DataProto.from_dict(tensors=m, non_tensors={k: v[idx] for k, v in data.non_tensor_batch.items()},
                                   meta_info=copy.deepcopy(data.meta_info)) for m, idx in zip(micro, parts)]
    return batches, parts
