"""Upstream's reward manager registry (`verl.workers.reward_manager.registry`), BatchRewardManager and
DAPORewardManager on rollout-shaped batches, selected by name through load_reward_manager."""
import pytest
import torch
from omegaconf import OmegaConf
from test_naive_reward_manager import RESPONSE_LEN, make_batch, tokenizer  # noqa: F401 (fixture)

from verl.trainer.ppo.reward import compute_reward, load_reward_manager
from verl.workers.reward_manager import BatchRewardManager, DAPORewardManager, NaiveRewardManager
from verl.workers.reward_manager.registry import REWARD_MANAGER_REGISTRY, get_reward_manager_cls, register

SAMPLES = [
    ("q1", "reasoning\nAnswer: 4", "math_dapo", "4"),
    ("q2", "Answer: 5", "math_dapo", "4"),
    ("q3", "so \\boxed{7}", "lighteval/MATH", "7"),
]


def _config(name, **reward_kwargs):
    return OmegaConf.create({"reward_model": {"reward_manager": name, "reward_kwargs": reward_kwargs},
                             "data": {"reward_fn_key": "data_source"}})


def test_registry_names_and_duplicate_registration():
    assert {"naive": NaiveRewardManager, "batch": BatchRewardManager, "dapo": DAPORewardManager}.items() \
        <= REWARD_MANAGER_REGISTRY.items()
    assert get_reward_manager_cls("dapo") is DAPORewardManager
    with pytest.raises(ValueError, match="already registered"):
        register("batch")(NaiveRewardManager)
    with pytest.raises(ValueError, match="available"):
        get_reward_manager_cls("nope")


def test_batch_manager_calls_the_scorer_once_for_the_batch(tokenizer):  # noqa: F811
    calls = []

    def score_all(data_sources, solution_strs, ground_truths, extra_infos, bonus):
        calls.append(list(solution_strs))
        return [{"score": float(s.endswith(g)) + bonus, "tag": i} for i, (s, g) in
                enumerate(zip(solution_strs, ground_truths))]

    manager = BatchRewardManager(tokenizer, num_examine=0, compute_score=score_all, bonus=0.5)
    data = make_batch(tokenizer, SAMPLES)
    reward, extra = compute_reward(data, manager)
    assert len(calls) == 1 and calls[0] == [s[1] for s in SAMPLES]
    lengths = data.batch["response_mask"].sum(-1)
    for i, want in enumerate([1.5, 0.5, 0.5]):       # "\\boxed{7}" does not end with "7"
        assert reward[i, lengths[i] - 1] == want and reward[i].sum() == want
    assert extra["tag"] == [0, 1, 2]
    assert data.batch["acc"].tolist() == [1.5, 0.5, 0.5]


def test_dapo_manager_scores_and_penalises_overlong_responses(tokenizer):  # noqa: F811
    data = make_batch(tokenizer, SAMPLES)
    lengths = data.batch["response_mask"].sum(-1).tolist()
    buffer = {"enable": True, "len": 8, "penalty_factor": 0.5, "log": True}
    config = _config("dapo", max_resp_len=RESPONSE_LEN, overlong_buffer_cfg=buffer)
    manager = load_reward_manager(config, tokenizer, **config.reward_model.reward_kwargs)
    assert isinstance(manager, DAPORewardManager)
    reward, extra = compute_reward(data, manager)
    base = [1.0, -1.0, 1.0]   # math_dapo +-1; MATH's boxed 7 == 7
    for i, n in enumerate(lengths):
        penalty = min(-(n - (RESPONSE_LEN - 8)) / 8 * 0.5, 0.0)
        assert penalty < 0   # every response is longer than max_resp_len - buffer = 2 tokens
        assert reward[i, n - 1].item() == pytest.approx(base[i] + penalty)
        assert extra["overlong_reward"][i] == pytest.approx(penalty)
    assert extra["acc"] == [True, False, 1.0]
    with pytest.raises(ValueError, match="max_resp_len"):
        DAPORewardManager(tokenizer, 0, overlong_buffer_cfg=buffer)


def test_dapo_without_penalty_equals_the_plain_scores(tokenizer):  # noqa: F811
    data = make_batch(tokenizer, SAMPLES)
    reward = DAPORewardManager(tokenizer, 0)(data)
    assert reward.sum(-1).tolist() == [1.0, -1.0, 1.0]
    assert torch.count_nonzero(reward) == 3
