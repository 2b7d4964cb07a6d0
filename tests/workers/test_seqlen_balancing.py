"""Token-budget micro-batching: every row lands in exactly one micro-batch, budgets hold, order restores."""
import pytest
import torch

from verl.utils.seqlen_balancing import (
    balanced_partitions,
    get_reverse_idx,
    make_micro_batches,
    rearrange_micro_batches,
    restore_dynamic_batch,
)


def _batch(lengths, width=16):
    mask = torch.zeros(len(lengths), width, dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, width - n :] = 1
    return {"attention_mask": mask, "row": torch.arange(len(lengths))}


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_balanced_partitions_cover_every_index_once(k):
    lengths = [9, 1, 7, 3, 3, 8, 2]
    parts = balanced_partitions(lengths, k)
    assert len(parts) == k and all(parts)
    assert sorted(i for p in parts for i in p) == list(range(len(lengths)))


def test_balanced_partitions_balance_totals():
    lengths = [10, 10, 5, 5, 5, 5]
    totals = sorted(sum(lengths[i] for i in p) for p in balanced_partitions(lengths, 2))
    assert totals == [20, 20]


def test_rearrange_respects_budget_and_restores_order():
    lengths = [12, 3, 9, 16, 4, 4, 7, 1]
    batch = _batch(lengths)
    micro, parts = rearrange_micro_batches(batch, max_token_len=20)
    assert sum(len(m["row"]) for m in micro) == len(lengths)
    for m in micro:
        assert int(m["attention_mask"].sum()) <= 20
    # fewest micro-batches the total allows (56 tokens / 20 -> at least 3)
    assert len(micro) >= 3
    per_row = torch.cat([m["row"].float() * 10 for m in micro])
    assert torch.equal(restore_dynamic_batch(per_row, parts), torch.arange(len(lengths)).float() * 10)


def test_rearrange_rejects_a_sequence_longer_than_the_budget():
    with pytest.raises(ValueError, match="token budget"):
        rearrange_micro_batches(_batch([5, 15]), max_token_len=10)


def test_fixed_size_micro_batches_keep_order():
    batch = _batch([1, 2, 3, 4, 5])
    micro, parts = make_micro_batches(batch, micro_batch_size=2)
    assert [len(m["row"]) for m in micro] == [2, 2, 1]
    assert parts == [[0, 1], [2, 3], [4]]


def test_reverse_idx_is_the_inverse_permutation():
    perm = [3, 0, 2, 1]
    inv = get_reverse_idx(perm)
    assert [perm[inv[j]] for j in range(4)] == [0, 1, 2, 3]
