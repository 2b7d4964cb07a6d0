"""Driver-side metrics: data statistics, timing per token, throughput, validation aggregation."""
import numpy as np
import pytest
import torch

from verl.protocol import DataProto
from verl.trainer.ppo.metric_utils import (
    compute_data_metrics,
    compute_throughout_metrics,
    compute_timing_metrics,
    process_validation_metrics,
)
from verl.trainer.ppo.ray_trainer import balanced_partitions


def make_batch():
    # 2 sequences: prompt width 3 (real lengths 3, 2), response width 2 (real lengths 2, 1)
    attention = torch.tensor([[1, 1, 1, 1, 1], [0, 1, 1, 1, 0]])
    response_mask = attention[:, 3:]
    return DataProto.from_dict(tensors={
        "prompts": torch.zeros(2, 3, dtype=torch.long), "responses": torch.zeros(2, 2, dtype=torch.long),
        "attention_mask": attention, "response_mask": response_mask,
        "token_level_scores": torch.tensor([[0.0, 1.0], [0.5, 0.0]]),
        "token_level_rewards": torch.tensor([[0.0, 0.9], [0.4, 0.0]]),
        "advantages": torch.tensor([[1.0, 2.0], [-3.0, 99.0]]),
        "returns": torch.tensor([[1.0, 1.0], [0.5, 99.0]]),
        "values": torch.tensor([[0.5, 0.5], [0.5, 99.0]]),
    })


def test_data_metrics_use_only_real_tokens():
    m = compute_data_metrics(make_batch(), use_critic=True)
    assert m["critic/score/mean"] == pytest.approx(0.75) and m["critic/score/min"] == pytest.approx(0.5)
    assert m["critic/rewards/max"] == pytest.approx(0.9)
    assert m["critic/advantages/mean"] == pytest.approx(0.0) and m["critic/advantages/max"] == 2.0  # 99 is padding
    assert m["critic/returns/min"] == 0.5 and m["critic/values/max"] == 0.5
    assert m["response_length/mean"] == 1.5 and m["response_length/clip_ratio"] == 0.5
    assert m["prompt_length/mean"] == 2.5 and m["prompt_length/clip_ratio"] == 0.5
    returns, values = np.array([1.0, 1.0, 0.5]), np.array([0.5, 0.5, 0.5])
    expected = 1 - np.var(returns - values, ddof=1) / (np.var(returns, ddof=1) + 1e-5)
    assert m["critic/vf_explained_var"] == pytest.approx(expected, abs=1e-5)  # float32 vs float64
    assert "critic/values/mean" not in compute_data_metrics(make_batch(), use_critic=False)


def test_timing_and_throughput():
    batch = make_batch()  # 5 prompt tokens + 3 response tokens
    timing = {"gen": 0.3, "update_actor": 0.8, "step": 2.0}
    m = compute_timing_metrics(batch, timing)
    assert m["timing_s/gen"] == 0.3 and m["timing_per_token_ms/gen"] == pytest.approx(100.0)
    assert m["timing_per_token_ms/update_actor"] == pytest.approx(100.0)
    p = compute_throughout_metrics(batch, timing, n_gpus=2)
    assert p == {"perf/total_num_tokens": 8, "perf/time_per_step": 2.0, "perf/throughput": 2.0}


def test_validation_metrics_group_by_prompt():
    sources = ["a", "a", "a", "a", "b"]
    uids = ["u1", "u1", "u2", "u2", "u3"]
    out = process_validation_metrics(sources, uids, {"reward": [1.0, 0.0, 1.0, 1.0, 0.25]})
    assert out["a"]["reward"]["mean@2"] == pytest.approx(0.75)
    assert out["a"]["reward"]["std@2"] == pytest.approx(0.25)  # mean of per-prompt std (0.5, 0)
    # best of 2 resampled from {1, 0}: P(max=1)=0.75; from {1, 1}: 1 -> mean 0.875 (bootstrap noise ~0.01)
    assert out["a"]["reward"]["best@2/mean"] == pytest.approx(0.875, abs=0.03)
    assert out["b"]["reward"] == {"mean@1": 0.25}


def test_balanced_partitions_equal_sizes_and_close_totals():
    lengths = [10, 1, 9, 2, 8, 3, 7, 4]
    parts = balanced_partitions(lengths, 2)
    assert sorted(i for p in parts for i in p) == list(range(8)) and [len(p) for p in parts] == [4, 4]
    totals = [sum(lengths[i] for i in p) for p in parts]
    assert abs(totals[0] - totals[1]) <= 2
    assert balanced_partitions(lengths, 1) == [list(range(8))]


def test_rollout_moe_load_balance_numbers_and_interval():
    from types import SimpleNamespace

    from verl.trainer.ppo.metric_utils import (RolloutMoELoadBalanceMetricsAccumulator, compute_moe_lb_metrics,
                                               compute_rollout_moe_load_balance_metrics, infer_moe_num_experts)

    # one layer, top-1 over 2 experts; the 5th slot is the last sampled token's filler and is not counted
    routed = torch.tensor([0, 0, 1, 0, 1]).reshape(1, 5, 1, 1)
    mask = torch.ones(1, 5, dtype=torch.bool)
    m = compute_rollout_moe_load_balance_metrics(routed, mask, num_experts=2)
    # counts [3, 1]: shares 0.75/0.25, times 2 experts minus 1 -> +0.5 / -0.5
    assert m["rollout/moe/max_vio/layer_0"] == 0.5 and m["rollout/moe/min_vio/layer_0"] == -0.5
    assert m["rollout/moe/avg_vio/avg"] == 0.5
    acc = RolloutMoELoadBalanceMetricsAccumulator(model_config={"n_routed_experts": 2})
    batch = SimpleNamespace(batch={"routed_experts": routed, "response_mask": mask})
    assert compute_moe_lb_metrics(batch, 2, global_steps=1, accumulator=acc) == {}
    out = compute_moe_lb_metrics(batch, 2, global_steps=2, accumulator=acc)
    assert out["rollout/moe/routed_expert_assignments"] == 8 and out["rollout/moe/max_vio/max"] == 0.5
    assert acc.total_assignments() == 0
    assert infer_moe_num_experts({"model_type": "qwen3_moe", "num_local_experts": 4}) is None


def test_step_compile_summary_is_the_min_of_compiled_passes_and_the_sum_of_their_compile_seconds():
    from verl.trainer.ppo.ray_trainer import _compile_summary

    metrics = {"perf/compiled_layers/generate_sequences": 1.0, "perf/compiled_layers/update_actor": 0.0,
               "perf/compile_s/generate_sequences": 12.5, "perf/compile_s/update_actor": 30.25}
    assert _compile_summary(metrics) == {"perf/compiled_layers": 0.0, "perf/compile_s": 42.75}
    assert _compile_summary({"actor/pg_loss": 1.0}) == {}
