"""compute_gdpo_outcome_advantage: per-component group normalisation, weighted sum, batch whitening, checked
against a float64 computation written out here."""
import numpy as np
import pytest
import torch

from verl.trainer.ppo.core_algos import ADV_ESTIMATOR_REGISTRY, compute_gdpo_outcome_advantage


def _group_norm(values, index, eps=1e-6):
    out = []
    for i, v in enumerate(values):
        group = [values[j] for j in range(len(values)) if index[j] == index[i]]
        mean = sum(group) / len(group)
        std = (sum((g - mean) ** 2 for g in group) / (len(group) - 1)) ** 0.5 if len(group) > 1 else 1.0
        out.append((v - mean) / (std + eps) if len(group) > 1 else v)
    return out


def test_components_are_normalised_apart_then_summed_and_whitened():
    index = np.array([0, 0, 0, 1, 1, 1])
    fmt = [1.0, 1.0, 0.0, 1.0, 0.0, 0.0]
    acc = [10.0, 0.0, 0.0, 0.0, 0.0, 10.0]          # a large-scale component does not drown the format reward
    prompts = torch.zeros(6, 2)
    lengths = [3, 2, 4, 1, 4, 2]
    mask = torch.tensor([[1.0] * n + [0.0] * (4 - n) for n in lengths])
    batch = {"prompts": prompts, "attention_mask": torch.cat([torch.ones(6, 2), mask], dim=1)}
    cols = {"format_reward": np.array(fmt), "accuracy_reward": np.array(acc)}
    config = {"gdpo_reward_keys": ["format_reward", "accuracy_reward"], "gdpo_reward_weights": [1.0, 0.5]}
    adv, ret = compute_gdpo_outcome_advantage(torch.zeros(6, 4), mask, index, config=config, non_tensor_batch=cols,
                                              batch=batch)
    per_row = [a + 0.5 * b for a, b in zip(_group_norm(fmt, index), _group_norm(acc, index))]
    tokens = [per_row[i] for i, n in enumerate(lengths) for _ in range(n)]
    mean = sum(tokens) / len(tokens)
    var = sum((t - mean) ** 2 for t in tokens) / (len(tokens) - 1)
    expected = torch.tensor([[(per_row[i] - mean) / (var + 1e-8) ** 0.5 if t < n else 0.0 for t in range(4)]
                             for i, n in enumerate(lengths)])
    assert torch.allclose(adv, expected, atol=1e-5) and adv is ret
    assert ADV_ESTIMATOR_REGISTRY["gdpo"] is compute_gdpo_outcome_advantage   # the trainer runs it (tests/e2e/test_gdpo_e2e.py)


def test_missing_keys_say_what_to_return():
    mask = torch.ones(2, 2)
    batch = {"prompts": torch.zeros(2, 1), "attention_mask": torch.ones(2, 3)}
    with pytest.raises(KeyError, match="format_reward"):
        compute_gdpo_outcome_advantage(torch.zeros(2, 2), mask, np.array([0, 0]),
                                       config={"gdpo_reward_keys": ["format_reward"]}, non_tensor_batch={},
                                       batch=batch)
    with pytest.raises(ValueError, match="gdpo_reward_keys"):
        compute_gdpo_outcome_advantage(torch.zeros(2, 2), mask, np.array([0, 0]), config={}, non_tensor_batch={},
                                       batch=batch)
