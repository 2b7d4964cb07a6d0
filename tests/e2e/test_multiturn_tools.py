"""Upstream's GSM8K multi-turn tool example through the stock `python -m verl.trainer.main_ppo`, unchanged
but for paths and CPU sizes: data written by examples/data_preprocess/gsm8k_multiturn_w_tool.py's row
builder, tools from examples/sglang_multiturn/config/tool_config/gsm8k_tool_config.yaml, GRPO for 2 steps.

The model is a tiny Qwen2 trained (tests/rollout/tool_calling_model.py) so that its greedy answer to the
example's prompt is a Hermes call of `calc_gsm8k_reward`; after Gsm8kTool's response it answers "#### 72".
The run must call the tool once per sequence, keep the tool's tokens out of the response mask (while the
model attends to them and the reward sees them), and score the right final answer.
"""
import sys

import pytest
from conftest import REPO_ROOT, run_main_ppo

sys.path.insert(0, str(REPO_ROOT))
from tests.rollout.tool_calling_model import (ANSWER, QUESTION, build_tool_calling_model,  # noqa: E402
                                              episode_ids, example_module)

TOOL_CONFIG = REPO_ROOT / "examples" / "sglang_multiturn" / "config" / "tool_config" / "gsm8k_tool_config.yaml"


@pytest.fixture(scope="module")
def tool_task(tmp_path_factory):
    root = tmp_path_factory.mktemp("multiturn")
    model = build_tool_calling_model(str(root / "model"))
    example = example_module()
    for split, n in (("train", 4), ("test", 2)):
        example.write_parquet([example.make_row(QUESTION, ANSWER, split, i) for i in range(n)],
                              str(root / f"{split}.parquet"))
    return root, model


def example_command(root, model, tmp_path, tool_config=TOOL_CONFIG) -> list[str]:
    return [
        "algorithm.adv_estimator=grpo",
        f"data.train_files={root}/train.parquet",
        f"data.val_files={root}/test.parquet",
        "data.train_batch_size=2",
        "data.max_prompt_length=256",
        "data.max_response_length=96",
        "data.return_raw_chat=True",
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.actor.optim.lr=1e-6",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.use_kl_loss=True",
        "actor_rollout_ref.actor.kl_loss_coef=0.001",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.rollout.do_sample=False",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.multi_turn.enable=True",
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=5",
        "actor_rollout_ref.rollout.multi_turn.format=hermes",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={tool_config}",
        "trainer.logger=[console,file]",
        "trainer.val_before_train=False",
        "trainer.test_freq=-1",
        "trainer.save_freq=-1",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        "trainer.total_training_steps=2",
        "data.dataloader_num_workers=0",
        f"trainer.default_local_dir={tmp_path / 'ckpt'}",
    ]


@pytest.mark.parametrize("engine", ["hf", "vllm"])
def test_gsm8k_multiturn_tool_example(tool_task, tmp_path, engine):
    """The built-in engine here; vLLM where its CPU build is installed (scripts/run_vllm_tests.sh)."""
    from transformers import AutoTokenizer

    if engine == "vllm":
        pytest.importorskip("vllm")
    root, model = tool_task
    proc, steps = run_main_ppo(example_command(root, model, tmp_path) + [f"actor_rollout_ref.rollout.name={engine}"],
                               log_path=tmp_path / "metrics.jsonl")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"  rollout  {engine} (" in proc.stdout + proc.stderr   # the plan kept the engine asked for
    assert sorted(steps) == [1, 2]
    _, call, tool, final = episode_ids(AutoTokenizer.from_pretrained(model))
    for step in (1, 2):
        m = steps[step]
        assert m["multi_turn/tool_calls"] == 1.0                       # Gsm8kTool ran once per sequence
        assert m["num_turns/mean"] == 4.0                               # prompt, call, tool response, answer
        assert m["multi_turn/observation_tokens"] == len(tool)         # tool tokens: attended, mask 0
        assert m["response_length/mean"] == len(call) + len(tool) + len(final)
        assert m["critic/score/mean"] == 1.0                            # "#### 72" after the tool's answer
        assert "actor/pg_loss" in m and "actor/kl_loss" in m


def test_a_tool_class_that_does_not_import_stops_the_run_before_ray(tool_task, tmp_path):
    root, model = tool_task
    bad = tmp_path / "tools.yaml"
    bad.write_text(TOOL_CONFIG.read_text().replace("verl.tools.gsm8k_tool.Gsm8kTool", "my_tools.Calculator"))
    proc, _ = run_main_ppo(example_command(root, model, tmp_path, tool_config=bad), timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "ray.init(" not in proc.stdout and "Traceback" not in proc.stderr
    message = proc.stderr[proc.stderr.index("verl: input error"):]
    assert f"{bad}: tools[0].class_name='my_tools.Calculator' does not import" in message
