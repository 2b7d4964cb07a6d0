"""Multi-turn tool rollouts on the vLLM engine (CPU build): the same episode, token for token and mask for
mask, as the built-in engine on the same weights, with one weight push per rollout (not one per turn).
Skipped where vLLM is not installed; CI runs it in scripts/run_vllm_tests.sh's environment."""
import pytest
import torch
from omegaconf import OmegaConf

pytest.importorskip("vllm")

from tests.rollout.test_multi_turn import TOOL_CONFIG, _prompts  # noqa: E402
from tests.rollout.tool_calling_model import build_tool_calling_model, episode_ids  # noqa: E402
from verl.workers.rollout import ENGINES, HFRollout  # noqa: E402
from verl.workers.rollout.multi_turn import MultiTurnRollout  # noqa: E402

PROMPT_LEN, RESPONSE_LEN = 256, 96


def _config(model_dir):
    return OmegaConf.create({
        "actor_rollout_ref": {
            "model": {"path": model_dir}, "actor": {"ppo_mini_batch_size": 2, "ppo_micro_batch_size_per_gpu": 2},
            "rollout": {"name": "vllm", "temperature": 1.0, "top_k": -1, "top_p": 1.0, "do_sample": False,
                        "prompt_length": PROMPT_LEN, "response_length": RESPONSE_LEN, "n": 1, "seed": 7,
                        "ignore_eos": False, "load_format": "dummy", "max_num_seqs": 8,
                        "val_kwargs": {"temperature": 0, "top_k": -1, "top_p": 1.0, "do_sample": False, "n": 1},
                        "multi_turn": {"enable": True, "max_assistant_turns": None, "max_user_turns": None,
                                       "max_parallel_calls": 1, "max_tool_response_length": 256,
                                       "tool_response_truncate_side": "middle", "format": "hermes",
                                       "tool_config_path": str(TOOL_CONFIG), "function_tool_path": None},
                        "agent": {"default_agent_loop": "single_turn_agent"}},
        },
        "data": {"max_prompt_length": PROMPT_LEN, "max_response_length": RESPONSE_LEN, "train_batch_size": 2},
        "trainer": {"n_gpus_per_node": 1, "nnodes": 1},
        "algorithm": {"adv_estimator": "grpo"},
    })


def test_vllm_multi_turn_matches_the_built_in_engine(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from verl.compat.device.catalog import get_profile
    from verl.compat.device.detect import detect_software
    from verl.compat.planning.model_spec import ModelSpec
    from verl.compat.planning.planner import make_plan

    model_dir = build_tool_calling_model(str(tmp_path / "model"))
    config = _config(model_dir)
    profile = get_profile("cpu")
    plan = make_plan(profile, config, detect_software(profile), ModelSpec.from_pretrained(model_dir))
    assert plan.rollout.name == "vllm"
    rollout_cfg = config.actor_rollout_ref.rollout
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    actor = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    vllm_engine = ENGINES["vllm"](actor, rollout_cfg, plan=plan)
    pushes = vllm_engine.weight_pushes
    ours = MultiTurnRollout(vllm_engine, tokenizer, rollout_cfg).generate_sequences(
        _prompts(tokenizer, ["tool_agent", "single_turn_agent"]))
    assert vllm_engine.weight_pushes == pushes + 1   # three turns, one push
    reference = MultiTurnRollout(HFRollout(actor, rollout_cfg), tokenizer, rollout_cfg).generate_sequences(
        _prompts(tokenizer, ["tool_agent", "single_turn_agent"]))
    for key in ("responses", "response_mask", "attention_mask", "position_ids"):
        assert torch.equal(ours.batch[key].cpu(), reference.batch[key]), key
    _, call, tool, final = episode_ids(tokenizer)
    assert ours.batch["responses"][0, :len(call) + len(tool) + len(final)].tolist() == call + tool + final
    assert ours.non_tensor_batch["tool_calls"].tolist() == [1, 0]
