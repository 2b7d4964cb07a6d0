"""PrimeRewardManager: responses scored in worker processes through the default scorer (prime_math for the
numina sources), selected by name; a scorer that hangs or raises scores 0 instead of stopping the batch."""
import time

import numpy as np
import pytest
import torch

from verl.protocol import DataProto
from verl.workers.reward_manager import PrimeRewardManager, get_reward_manager_cls

SAMPLES = [
    ("q1", "Step 2: so the answer is \\boxed{\\frac{1}{2}}", "numina_olympiads", "0.5"),
    ("q2", "The answer is \\boxed{3}", "numina_cn_k12", "4"),
    ("q3", "so \\boxed{7}", "lighteval/MATH", "7"),
]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from verl.utils.tiny_model import build_tokenizer

    return build_tokenizer(str(tmp_path_factory.mktemp("tok")), [t for s in SAMPLES for t in s[:2]] * 20)


def make_batch(tokenizer, samples):
    """Left-padded prompts, right-padded responses, as the rollout returns them."""
    pad = tokenizer.pad_token_id
    enc = [(tokenizer.encode(p, add_special_tokens=False), tokenizer.encode(r, add_special_tokens=False))
           for p, r, _, _ in samples]
    width_p, width_r = max(len(p) for p, _ in enc), max(len(r) for _, r in enc)
    prompts = torch.tensor([[pad] * (width_p - len(p)) + p for p, _ in enc])
    responses = torch.tensor([r + [pad] * (width_r - len(r)) for _, r in enc])
    mask = torch.tensor([[0] * (width_p - len(p)) + [1] * (len(p) + len(r)) + [0] * (width_r - len(r))
                         for p, r in enc])
    return DataProto.from_dict(
        tensors={"prompts": prompts, "responses": responses, "attention_mask": mask,
                 "input_ids": torch.cat([prompts, responses], dim=1)},
        non_tensors={"data_source": np.array([s[2] for s in samples], dtype=object),
                     "reward_model": np.array([{"ground_truth": s[3]} for s in samples], dtype=object)})


def _slow_or_broken(data_source, solution_str, ground_truth, extra_info=None):
    if "boxed{3}" in solution_str:
        time.sleep(30)
    if data_source == "lighteval/MATH":
        raise RuntimeError("scorer bug")
    return 1.0


def test_prime_manager_scores_on_the_last_response_token(tokenizer):
    assert get_reward_manager_cls("prime") is PrimeRewardManager
    data = make_batch(tokenizer, SAMPLES)
    out = PrimeRewardManager(tokenizer, num_examine=0, num_processes=2)(data, return_dict=True)
    reward = out["reward_tensor"]
    lengths = data.batch["attention_mask"][:, data.batch["prompts"].shape[-1]:].sum(-1)
    assert [reward[i, lengths[i] - 1].item() for i in range(3)] == [1.0, 0.0, 1.0]
    assert reward.sum().item() == 2.0
    assert data.batch["acc"].tolist() == [1.0, 0.0, 1.0]


def test_prime_manager_gives_zero_to_a_hung_or_failing_scorer(tokenizer):
    data = make_batch(tokenizer, SAMPLES)
    manager = PrimeRewardManager(tokenizer, num_examine=0, compute_score=_slow_or_broken, num_processes=3, timeout=2)
    start = time.monotonic()
    scores = manager.verify(data)
    assert scores == [1.0, 0.0, 0.0] and time.monotonic() - start < 25
