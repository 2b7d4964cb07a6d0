"""The reward model worker on CPU with a tiny Qwen2ForSequenceClassification, planned by the real planner.

Tolerances: the worker scores left-padded micro-batches in float32, the reference is transformers'
own forward of each row alone without padding, so only summation order differs: 1e-5 absolute.
"""
import os
import sys

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from worker_setup import PROMPT_LEN, RESPONSE_LEN, actor_rollout_ref_config, cpu_plan, ppo_batch  # noqa: E402

from verl.workers.reward_model.inputs import classification_head_problem  # noqa: E402
from verl.workers.reward_model.worker import RewardModelWorker  # noqa: E402


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    from verl.utils.tiny_model import build_tiny_model_dir

    root = tmp_path_factory.mktemp("rm")
    small = {"hidden_size": 32, "num_layers": 2, "intermediate_size": 64, "num_heads": 4, "num_kv_heads": 2}
    policy = build_tiny_model_dir(str(root / "policy"), seed=0, **small)
    rm = build_tiny_model_dir(str(root / "rm"), seed=1, reward_head=True, **small)
    return policy, rm


def _config(policy, rm, **rm_keys):
    return OmegaConf.create({
        "actor_rollout_ref": actor_rollout_ref_config(policy),
        "reward": {"reward_model": {"enable": True, "model_path": rm, **rm_keys,
                                    "rollout": {"prompt_length": PROMPT_LEN, "response_length": RESPONSE_LEN}}},
    })


def _worker(policy, rm, device="cpu", **plan_keys):
    plan = cpu_plan(policy, device=device, reward__reward_model__enable=True,
                    reward__reward_model__model_path=rm, **plan_keys)
    worker = RewardModelWorker(_config(policy, rm), plan=plan)
    worker.init_model()
    return worker, plan


def _batch(seed=0):
    data = ppo_batch(seed=seed)
    data.batch["prompts"] = data.batch["input_ids"][:, :PROMPT_LEN]
    return data


def _reference(rm, rows):
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(rm, dtype=torch.float32, attn_implementation="sdpa")
    with torch.no_grad():
        return torch.tensor([model(input_ids=torch.tensor([r])).logits[0, 0].item() for r in rows])


def test_scores_match_a_direct_forward_and_sit_on_the_last_response_token(dirs):
    policy, rm = dirs
    worker, plan = _worker(policy, rm)
    assert plan.reward_model.micro_batch_size_per_gpu == 2 and plan.reward_model.compute_dtype == "float32"
    data = _batch()
    scores = worker.compute_rm_score(data).batch["rm_scores"]
    mask = data.batch["attention_mask"]
    rows = [data.batch["input_ids"][i][mask[i].bool()].tolist() for i in range(len(data))]
    torch.testing.assert_close(scores.sum(-1), _reference(rm, rows), atol=1e-5, rtol=0)
    last = mask[:, PROMPT_LEN:].sum(-1) - 1
    nonzero = scores != 0
    assert nonzero.sum(-1).tolist() == [1] * len(data)
    assert nonzero.float().argmax(-1).tolist() == last.tolist()


def test_chat_messages_are_re_templated_with_the_reward_models_template(dirs):
    from transformers import AutoTokenizer

    policy, rm = dirs
    worker, _ = _worker(policy, rm)
    data = _batch(seed=1)
    chats = [[{"role": "user", "content": f"what is {i} + {i}?"}] for i in range(len(data))]
    column = np.empty(len(chats), dtype=object)
    for i, chat in enumerate(chats):
        column[i] = chat
    data.non_tensor_batch["raw_prompt"] = column
    out = worker.compute_rm_score(data)
    scores = out.batch["rm_scores"].sum(-1)

    tok = AutoTokenizer.from_pretrained(rm)
    valid = data.batch["attention_mask"][:, PROMPT_LEN:].sum(-1).tolist()
    rows = []
    for i, chat in enumerate(chats):
        answer = tok.decode(data.batch["responses"][i, : valid[i]], skip_special_tokens=True)
        text = tok.apply_chat_template(chat + [{"role": "assistant", "content": answer}], tokenize=False)
        assert text.startswith("<|im_start|>user\n") and text.endswith("<|im_end|>\n")
        rows.append(tok(text, add_special_tokens=False)["input_ids"])
    # rows longer than rollout.prompt_length + response_length keep their end, where the score is read
    max_len = PROMPT_LEN + RESPONSE_LEN
    expected = _reference(rm, [r[-max_len:] for r in rows])
    torch.testing.assert_close(scores, expected, atol=1e-5, rtol=0)
    cut = sum(len(r) > max_len for r in rows)
    assert cut > 0 and out.meta_info["metrics"]["reward_model/truncated_ratio"] == cut / len(rows)


def test_float16_plan_guards_the_scores_against_float32(dirs):
    """A T4 plan (float16 compute, float32 weights for the guard) run on the host CPU: the tiny model
    passes the guard, so the scores stay float16 ones, within float16's rounding of float32's."""
    policy, rm = dirs
    worker, plan = _worker(policy, rm, device="t4")
    rp = plan.reward_model
    assert (rp.compute_dtype, rp.param_dtype, rp.numerics_guard) == ("float16", "float32", True)
    data = _batch()
    out = worker.compute_rm_score(data)
    assert "reward_model/numerics_fallback" not in out.meta_info["metrics"]
    assert worker.compute_dtype == torch.float16
    mask = data.batch["attention_mask"]
    rows = [data.batch["input_ids"][i][mask[i].bool()].tolist() for i in range(len(data))]
    torch.testing.assert_close(out.batch["rm_scores"].sum(-1), _reference(rm, rows), atol=2e-2, rtol=2e-2)


def test_a_causal_lm_is_refused_naming_the_key(dirs):
    policy, rm = dirs
    assert classification_head_problem(rm, "reward.reward_model.model_path") is None
    problem = classification_head_problem(policy, "reward.reward_model.model_path")
    assert problem.startswith(f"reward.reward_model.model_path={policy}: ")
    assert "Qwen2ForCausalLM" in problem and "classification head" in problem
    worker = RewardModelWorker(_config(policy, policy), plan=cpu_plan(
        policy, reward__reward_model__enable=True, reward__reward_model__model_path=policy))
    with pytest.raises(ValueError, match="not a sequence classifier"):
        worker.init_model()
