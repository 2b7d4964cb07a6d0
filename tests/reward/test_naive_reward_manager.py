"""NaiveRewardManager on a DataProto shaped like a rollout's output (left-padded prompts, right-padded responses)."""

import functools

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer

from shared_data import tiny_tokenizer_dir
from verl.protocol import DataProto
from verl.trainer.ppo.reward import compute_reward
from verl.workers.reward_manager import NaiveRewardManager

PROMPT_LEN, RESPONSE_LEN = 12, 10
# what the batches below encode: a tokenizer trained on it keeps every prompt and response within the lengths
CORPUS = ["What is 2+2? It is 4.\n#### 4", "What is 3+4? #### 8", "Name 1,000 in digits Sure: #### 1,000 ok",
          "Say nothing ok", "q1 q2 q3 reasoning\nAnswer: 4 Answer: 5 so \\boxed{7}"] * 8


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    """Decoding is all a reward manager does with its tokenizer, so one built here serves."""
    return AutoTokenizer.from_pretrained(tiny_tokenizer_dir(tmp_path_factory.mktemp("tokenizer"), CORPUS))


def make_batch(tokenizer, samples):
    """samples: (prompt text, response text, data_source, ground truth). Pads like the rollout does."""
    pad = tokenizer.pad_token_id
    prompts, responses, masks = [], [], []
    for prompt, response, _, _ in samples:
        p = tokenizer.encode(prompt, add_special_tokens=False)
        r = tokenizer.encode(response, add_special_tokens=False)
        assert len(p) <= PROMPT_LEN and len(r) <= RESPONSE_LEN
        prompts.append([pad] * (PROMPT_LEN - len(p)) + p)
        responses.append(r + [pad] * (RESPONSE_LEN - len(r)))
        masks.append([0] * (PROMPT_LEN - len(p)) + [1] * (len(p) + len(r)) + [0] * (RESPONSE_LEN - len(r)))
    prompts, responses, masks = torch.tensor(prompts), torch.tensor(responses), torch.tensor(masks)
    return DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": responses,
            "input_ids": torch.cat([prompts, responses], dim=1),
            "attention_mask": masks,
            "response_mask": masks[:, PROMPT_LEN:],
        },
        non_tensors={
            "data_source": np.array([s[2] for s in samples], dtype=object),
            "reward_model": np.array([{"style": "rule", "ground_truth": s[3]} for s in samples], dtype=object),
            "extra_info": np.array([{"index": i} for i in range(len(samples))], dtype=object),
        },
    )


SAMPLES = [
    ("What is 2+2?", "It is 4.\n#### 4", "openai/gsm8k", "4"),
    ("What is 3+4?", "#### 8", "openai/gsm8k", "7"),
    ("Name 1,000 in digits", "Sure: #### 1,000 ok", "openai/gsm8k", "1000"),
    ("Say nothing", "ok", "openai/gsm8k", "5"),
]


def test_score_sits_on_the_last_real_response_token(tokenizer):
    data = make_batch(tokenizer, SAMPLES)
    rewards = NaiveRewardManager(tokenizer, num_examine=0)(data)
    assert rewards.shape == (4, RESPONSE_LEN) and rewards.dtype == torch.float32
    lengths = data.batch["response_mask"].sum(-1)
    expected = torch.zeros(4, RESPONSE_LEN)
    for i, score in enumerate([1.0, 0.0, 1.0, 0.0]):
        expected[i, lengths[i] - 1] = score
    assert torch.equal(rewards, expected)


def test_scorer_sees_the_decoded_response_and_the_row(tokenizer):
    calls = []

    def spy(data_source, solution_str, ground_truth, extra_info):
        calls.append((data_source, solution_str, ground_truth, extra_info))
        return 0.5

    data = make_batch(tokenizer, SAMPLES[:2])
    NaiveRewardManager(tokenizer, 0, compute_score=spy)(data)
    assert calls == [
        ("openai/gsm8k", "It is 4.\n#### 4", "4", {"index": 0}),
        ("openai/gsm8k", "#### 8", "7", {"index": 1}),
    ]
    assert data.non_tensor_batch["extra_info"][0] == {"index": 0}  # the batch is not modified


def test_dict_results_give_extra_infos(tokenizer):
    def scorer(data_source, solution_str, ground_truth, extra_info):
        return {"score": 2.0 if ground_truth in solution_str else -1.0, "length": len(solution_str)}

    data = make_batch(tokenizer, SAMPLES[:2])
    out = NaiveRewardManager(tokenizer, 0, compute_score=scorer)(data, return_dict=True)
    assert out["reward_tensor"].sum(-1).tolist() == [2.0, -1.0]
    assert dict(out["reward_extra_info"]) == {"score": [2.0, -1.0], "length": [15, 6]}

    tensor, extra = compute_reward(data, NaiveRewardManager(tokenizer, 0, compute_score=scorer))
    assert torch.equal(tensor, out["reward_tensor"]) and extra["length"] == [15, 6]


def test_dict_without_score_is_explained(tokenizer):
    manager = NaiveRewardManager(tokenizer, 0, compute_score=lambda **kw: {"acc": 1.0})
    with pytest.raises(KeyError, match="'score'"):
        manager(make_batch(tokenizer, SAMPLES[:1]))


def test_reward_fn_key_picks_the_data_source_column(tokenizer):
    data = make_batch(tokenizer, SAMPLES[:1])
    data.non_tensor_batch["task"] = np.array(["custom/task"], dtype=object)
    seen = []

    def scorer(data_source, **kwargs):
        seen.append(data_source)
        return 0.0

    NaiveRewardManager(tokenizer, 0, compute_score=scorer, reward_fn_key="task")(data)
    assert seen == ["custom/task"]


def test_missing_column_is_named(tokenizer):
    data = make_batch(tokenizer, SAMPLES[:1])
    del data.non_tensor_batch["reward_model"]
    with pytest.raises(KeyError, match="reward_model"):
        NaiveRewardManager(tokenizer, 0)(data)


def test_num_examine_prints_that_many_per_data_source(tokenizer, capsys):
    samples = SAMPLES[:3] + [("What is 1+1?", "#### 2", "other/source", "2")]
    manager = NaiveRewardManager(tokenizer, 1, compute_score=lambda **kw: 1.0)
    manager(make_batch(tokenizer, samples))
    printed = capsys.readouterr().out
    assert printed.count("[prompt]") == 2  # one per data source
    assert "[prompt] What is 2+2?" in printed and "[response] #### 2" in printed and "[score] 1.0" in printed


def nan_for_the_third(data_source, solution_str, ground_truth, extra_info=None):
    return float("nan") if extra_info["index"] == 2 else 1.0


def test_a_nan_reward_names_the_function_the_sample_and_its_data_source(tokenizer):
    manager = NaiveRewardManager(tokenizer, 0, compute_score=nan_for_the_third)
    with pytest.raises(ValueError) as err:
        manager(make_batch(tokenizer, SAMPLES))
    message = str(err.value)
    assert "nan_for_the_third" in message and "test_naive_reward_manager.py" in message
    assert "sample 2 of the batch" in message and "data_source='openai/gsm8k'" in message
    assert "learning rate" not in message                 # not mistaken for a training instability


def test_a_string_reward_names_the_function_and_the_value(tokenizer):
    from verl.trainer.ppo.reward import _call_with_kwargs

    def says_yes(data_source, solution_str, ground_truth, extra_info=None, bonus=0):
        return "yes"

    wrapped = functools.partial(_call_with_kwargs, says_yes, {"bonus": 1})   # as reward_kwargs wrap it
    manager = NaiveRewardManager(tokenizer, 0, compute_score=wrapped)
    with pytest.raises(TypeError, match=r"says_yes .* returned 'yes' \(str\) for sample 0"):
        manager(make_batch(tokenizer, SAMPLES[:1]))
    numpy_and_tensor = NaiveRewardManager(tokenizer, 0, compute_score=lambda **kw: np.float32(0.5))
    assert numpy_and_tensor(make_batch(tokenizer, SAMPLES[:1])).sum().item() == 0.5
