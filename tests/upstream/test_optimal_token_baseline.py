"""compute_optimal_token_baseline_advantage against a float64 reference written out per group and position."""
import numpy as np
import pytest
import torch

from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, compute_optimal_token_baseline_advantage


def _reference(rewards, mask, index, logp, sum_sq, zero_tail=True):
    rewards, mask, logp, sum_sq = (t.tolist() for t in (rewards, mask, logp, sum_sq))
    n, length = len(rewards), len(rewards[0])
    ret = [[sum(rewards[i][j] * mask[i][j] for j in range(t, length)) for t in range(length)] for i in range(n)]
    w = []
    for i in range(n):
        acc, row = 0.0, []
        for t in range(length):
            acc += (1 - 2 * np.exp(logp[i][t]) + sum_sq[i][t]) * mask[i][t]
            row.append(acc * mask[i][t])
        w.append(row)
    adv = [[0.0] * length for _ in range(n)]
    for key in set(index.tolist()):
        rows = [i for i in range(n) if index[i] == key]
        base = [0.0] * length
        if len(rows) > 1:
            base = [sum(ret[i][t] * w[i][t] for i in rows) / (sum(w[i][t] for i in rows) + 1e-8) for t in range(length)]
        lengths = sorted(sum(mask[i]) for i in rows)
        for i in rows:
            b = list(base)
            if zero_tail and len(rows) > 1 and sum(mask[i]) == lengths[-1] and lengths[-1] > lengths[-2]:
                b[int(lengths[-2]):] = [0.0] * (length - int(lengths[-2]))
            adv[i] = [(ret[i][t] - b[t]) * mask[i][t] for t in range(length)]
    return torch.tensor(adv, dtype=torch.float64)


def test_matches_the_reference_and_is_not_a_registered_estimator():
    g = torch.Generator().manual_seed(1)
    rewards = torch.zeros(5, 6, dtype=torch.float64)
    mask = torch.tensor([[1] * 6, [1] * 4 + [0] * 2, [1] * 3 + [0] * 3, [1] * 5 + [0], [1] * 2 + [0] * 4],
                        dtype=torch.float64)
    for i, n in enumerate(mask.sum(-1).long().tolist()):
        rewards[i, n - 1] = float(i % 2)
    logp = -torch.rand(5, 6, generator=g, dtype=torch.float64) * 3
    sum_sq = torch.rand(5, 6, generator=g, dtype=torch.float64) * 0.5
    index = np.array(["a", "a", "a", "b", "c"], dtype=object)
    adv, ret = compute_optimal_token_baseline_advantage(rewards, mask, index, logp, sum_sq)
    assert torch.allclose(adv, _reference(rewards, mask, index, logp, sum_sq), atol=1e-12)
    assert torch.equal(adv[4], ret[4] * mask[4])          # a group of one keeps its returns
    assert (adv[0, 4:] == ret[0, 4:]).all()               # the single longest response's tail has no baseline
    assert "optimal_token_baseline" not in ADV_ESTIMATOR_REGISTRY


def test_rollout_weights_scale_the_path_weight():
    rewards = torch.tensor([[0.0, 1.0], [0.0, 0.0]], dtype=torch.float64)
    mask = torch.ones(2, 2, dtype=torch.float64)
    logp = torch.log(torch.full((2, 2), 0.5, dtype=torch.float64))
    sum_sq = torch.full((2, 2), 0.5, dtype=torch.float64)        # w_t = 1 - 1 + 0.5 = 0.5 per token
    weights = torch.tensor([[2.0, 2.0], [1.0, 1.0]], dtype=torch.float64)
    adv, _ = compute_optimal_token_baseline_advantage(rewards, mask, np.array([0, 0]), logp, sum_sq,
                                                      rollout_is_weights=weights)
    # W for row 0 is 4x row 1's, so the baseline is 4/5 of row 0's return at every step (epsilon=1e-8 in the
    # denominator: agreement to 1e-7)
    assert adv[0].tolist() == pytest.approx([1 - 0.8, 1 - 0.8], abs=1e-7)
    assert adv[1].tolist() == pytest.approx([-0.8, -0.8], abs=1e-7)
