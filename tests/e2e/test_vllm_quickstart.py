"""Upstream's quick-start command with `rollout.name=vllm`, run where vLLM's CPU build is installed.

The same command as test_quickstart.py (which runs where vLLM is absent and checks the fallback to
the built-in engine); here the plan must keep vllm and every rollout must push the actor's weights
into vLLM in memory. The tiny model has head_dim 32, the smallest vLLM's CPU attention runs.
Skipped where vLLM is not installed; CI runs it in its own environment (scripts/run_vllm_tests.sh).
"""
import pytest

pytest.importorskip("vllm")

from conftest import GSM8K_SOURCE, console_metrics, run_main_ppo  # noqa: E402
from test_quickstart import COMMON_METRICS, quickstart_command  # noqa: E402


@pytest.fixture(scope="module")
def vllm_model(tmp_path_factory):
    import json

    from verl.utils.tiny_model import build_tiny_model_dir

    questions = [json.loads(line)["question"] for line in (GSM8K_SOURCE / "train.jsonl").open()][:2000] \
        if GSM8K_SOURCE.is_dir() else None
    return build_tiny_model_dir(str(tmp_path_factory.mktemp("vllm_model")), corpus_texts=questions,
                                vocab_size=1024, num_heads=2, num_kv_heads=1)


@pytest.mark.slow
def test_ppo_quickstart_with_vllm(gsm8k_data, vllm_model, tmp_path):
    overrides = [o for o in quickstart_command(gsm8k_data, vllm_model, tmp_path)
                 if not o.startswith("actor_rollout_ref.rollout.gpu_memory_utilization=")]
    # 0.4 of a shared CI host's memory is 9 GiB of KV cache; auto sizes it to what this run needs.
    proc, _ = run_main_ppo(overrides + ["actor_rollout_ref.rollout.gpu_memory_utilization=auto"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    output = proc.stdout + proc.stderr
    assert "rollout.name=vllm is not possible" not in output
    assert "  rollout  vllm (float32, vllm," in output  # the plan printed at start-up keeps vllm
    assert "rollout.name: set by the user; usable here" in output
    steps = console_metrics(proc.stdout)
    assert sorted(steps) == [1, 2]
    for metric in COMMON_METRICS:
        assert metric in steps[1], metric
    # one in-memory push per rollout: step 1, step 2, then the validation at the last step
    assert steps[1]["rollout/weight_pushes"] == 1 and steps[2]["rollout/weight_pushes"] >= 2
    assert "val-core/openai/gsm8k/reward/mean@1" in steps[2]
