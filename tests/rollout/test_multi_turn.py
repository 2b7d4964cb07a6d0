"""Multi-turn tool rollouts: the Hermes parser, tool-response truncation, upstream's GSM8K tool, the agent
loops over the real built-in engine with a tiny model trained to call the tool, the response mask (tool
tokens 0, attended to), the actor's loss ignoring tool tokens, and the pre-Ray tool-config errors."""
import asyncio
import json

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from tests.rollout.tool_calling_model import REPO, TOOL_TEXT, build_tool_calling_model, episode_ids
from verl.experimental.agent_loop.tool_agent_loop import tool_message_ids, truncate_tool_response
from verl.experimental.agent_loop.tool_parser import HermesToolParser, ToolParser
from verl.protocol import DataProto
from verl.tools.tool_registry import initialize_tools_from_config
from verl.workers.rollout import HFRollout
from verl.workers.rollout.multi_turn import MultiTurnRollout, load_tools

TOOL_CONFIG = REPO / "examples" / "sglang_multiturn" / "config" / "tool_config" / "gsm8k_tool_config.yaml"
torch.set_num_threads(1)


# ------------------------------------------------------------------ parsing and truncation

def test_hermes_parses_calls_in_order_and_skips_malformed_blocks():
    parser = HermesToolParser(tokenizer=None)
    text = ('think<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call> and '
            '<tool_call>not json</tool_call><tool_call>{"arguments": {}}</tool_call>'
            '<tool_call>{"name": "b", "arguments": {"y": "2"}}</tool_call>')
    content, calls = parser.parse_text(text)
    assert [c.name for c in calls] == ["a", "b"]
    assert [json.loads(c.arguments) for c in calls] == [{"x": 1}, {"y": "2"}]
    assert content == "think and "
    assert parser.parse_text("no call here <tool_call> unclosed") == ("no call here <tool_call> unclosed", [])


def test_unknown_format_names_the_key():
    with pytest.raises(ValueError, match="multi_turn.format='nope'"):
        ToolParser.get_tool_parser("nope", None)


@pytest.mark.parametrize("side,expected", [
    ("left", "(truncated)...6789"),
    ("right", "0123...(truncated)"),
    ("middle", "01...(truncated)...89"),
])
def test_tool_response_truncation(side, expected):
    assert truncate_tool_response("0123456789", 4, side) == expected
    assert truncate_tool_response("0123", 4, side) == "0123"


def test_truncation_side_must_be_known():
    with pytest.raises(ValueError, match="tool_response_truncate_side='top'"):
        truncate_tool_response("0123456789", 4, "top")


# ------------------------------------------------------------------ the GSM8K tool

def test_gsm8k_tool_from_the_example_config_grades_answers():
    (tool,) = initialize_tools_from_config(str(TOOL_CONFIG))
    assert tool.name == "calc_gsm8k_reward"
    assert tool.tool_schema.function.parameters.required == ["answer"]

    async def episode():
        iid, _ = await tool.create(create_kwargs={"ground_truth": "72"})
        wrong = await tool.execute(iid, {"answer": "70"})
        right = await tool.execute(iid, {"answer": "72"})
        again = await tool.execute(iid, {"answer": "#### 72"})
        final = await tool.calc_reward(iid)
        await tool.release(iid)
        return wrong, right, again, final

    wrong, right, again, final = asyncio.run(episode())
    assert wrong[0].text == "Current parsed answer='70' reward=0.0" and wrong[1] == -0.05
    assert right[0].text == TOOL_TEXT and right[1] == 0.0
    assert again[1] == -0.05   # no improvement
    assert final == 1.0


# ------------------------------------------------------------------ the rollout

@pytest.fixture(scope="module")
def tool_model(tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = build_tool_calling_model(str(tmp_path_factory.mktemp("tool_model")))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    return path, model, AutoTokenizer.from_pretrained(path)


def _rollout_config(**multi_turn):
    mt = {"enable": True, "max_assistant_turns": None, "max_user_turns": None, "max_parallel_calls": 1,
          "max_tool_response_length": 256, "tool_response_truncate_side": "middle", "format": "hermes",
          "tool_config_path": str(TOOL_CONFIG), "function_tool_path": None}
    mt.update(multi_turn)
    return OmegaConf.create({
        "temperature": 1.0, "top_k": -1, "top_p": 1.0, "do_sample": False, "prompt_length": 256,
        "response_length": 96, "n": 1, "seed": 7, "ignore_eos": False,
        "val_kwargs": {"temperature": 0, "top_k": -1, "top_p": 1.0, "do_sample": False, "n": 1},
        "multi_turn": mt, "agent": {"default_agent_loop": "single_turn_agent"},
    })


def _prompts(tokenizer, agent_names, prompt_length=256):
    prompt, *_ = episode_ids(tokenizer)
    n = len(agent_names)
    ids = torch.full((n, prompt_length), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    ids[:, -len(prompt):] = torch.tensor(prompt)
    mask[:, -len(prompt):] = 1
    kwargs = np.empty(n, dtype=object)
    kwargs[:] = [{"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": "72"}}}] * n
    return DataProto.from_dict(
        tensors={"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)},
        non_tensors={"tools_kwargs": kwargs, "agent_name": np.array(agent_names, dtype=object)},
        meta_info={"eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id},
    )


def _run(tool_model, agent_names, **multi_turn):
    _, model, tokenizer = tool_model
    config = _rollout_config(**multi_turn)
    engine = HFRollout(model, config)
    return MultiTurnRollout(engine, tokenizer, config).generate_sequences(_prompts(tokenizer, agent_names))


def test_tool_agent_calls_the_tool_and_masks_its_response(tool_model):
    _, _, tokenizer = tool_model
    prompt, call, tool, final = episode_ids(tokenizer)
    out = _run(tool_model, ["tool_agent", "single_turn_agent", None])
    responses, rmask = out.batch["responses"], out.batch["response_mask"]
    attn = out.batch["attention_mask"][:, -responses.shape[1]:]

    # tool_agent: call, the tool's answer (from Gsm8kTool), the final answer
    episode = call + tool + final
    assert responses[0, :len(episode)].tolist() == episode
    assert TOOL_TEXT in tokenizer.decode(responses[0, :len(episode)])
    assert rmask[0].tolist() == [1] * len(call) + [0] * len(tool) + [1] * len(final) + [0] * (96 - len(episode))
    assert attn[0].tolist() == [1] * len(episode) + [0] * (96 - len(episode))   # tool tokens are attended to
    assert out.non_tensor_batch["tool_calls"].tolist() == [1, 0, 0]
    assert out.meta_info["metrics"] == {"multi_turn/tool_calls": pytest.approx(1 / 3),
                                        "multi_turn/observation_tokens": pytest.approx(len(tool) / 3)}
    assert out.non_tensor_batch["__num_turns__"].tolist() == [4, 2, 2]   # upstream: prompt + assistant + tool turns

    # single_turn_agent (named, and the default for a row without a name): the call only, nothing runs
    for row in (1, 2):
        assert responses[row, :len(call)].tolist() == call
        assert rmask[row].tolist() == [1] * len(call) + [0] * (96 - len(call))
    assert out.batch["input_ids"].shape == (3, 256 + 96)
    assert torch.equal(out.batch["input_ids"][:, :256], out.batch["prompts"])
    positions = out.batch["position_ids"]
    assert torch.equal(positions[:, 256:] - positions[:, 255:256], torch.arange(1, 97).expand(3, -1))


def test_turn_limits_stop_the_loop(tool_model):
    _, _, tokenizer = tool_model
    _, call, tool, _ = episode_ids(tokenizer)
    out = _run(tool_model, ["tool_agent"], max_assistant_turns=1)
    assert out.non_tensor_batch["tool_calls"].tolist() == [0]
    assert out.batch["response_mask"][0].sum().item() == len(call)
    out = _run(tool_model, ["tool_agent"], max_user_turns=1)   # one tool round, then the model's last turn
    assert out.non_tensor_batch["tool_calls"].tolist() == [1]


def test_tool_response_is_truncated_to_max_tool_response_length(tool_model):
    _, _, tokenizer = tool_model
    _, call, _, _ = episode_ids(tokenizer)
    out = _run(tool_model, ["tool_agent"], max_tool_response_length=10, tool_response_truncate_side="right")
    cut = tool_message_ids(tokenizer, [TOOL_TEXT[:10] + "...(truncated)"])
    row = out.batch["responses"][0].tolist()
    assert row[len(call):len(call) + len(cut)] == cut
    assert out.batch["response_mask"][0, len(call):len(call) + len(cut)].sum().item() == 0


def test_response_budget_covers_tool_tokens(tool_model):
    _, _, tokenizer = tool_model
    _, call, tool, _ = episode_ids(tokenizer)
    budget = len(call) + 5   # the tool's message is cut at the budget and the loop ends
    _, model, _ = tool_model
    config = _rollout_config()
    config.response_length = budget
    out = MultiTurnRollout(HFRollout(model, config), tokenizer, config).generate_sequences(
        _prompts(tokenizer, ["tool_agent"]))
    assert out.batch["responses"].shape == (1, budget)
    assert out.batch["responses"][0].tolist() == call + tool[:5]
    assert out.batch["response_mask"][0].tolist() == [1] * len(call) + [0] * 5


# ------------------------------------------------------------------ the loss ignores tool tokens

def test_actor_loss_ignores_tool_tokens(tool_model):
    from verl.workers.actor.dp_actor import DataParallelPPOActor, Precision

    _, model, tokenizer = tool_model
    out = _run(tool_model, ["tool_agent"])
    mask = out.batch["response_mask"]
    tool_tokens = (mask == 0) & (out.batch["attention_mask"][:, -mask.shape[1]:] == 1)
    assert tool_tokens.sum() > 0
    actor = DataParallelPPOActor(OmegaConf.create({"ppo_mini_batch_size": 1, "use_kl_loss": True,
                                                   "kl_loss_coef": 0.1, "entropy_coeff": 0.01}),
                                 model, torch.optim.SGD(model.parameters(), lr=0.0), precision=Precision("cpu"))
    torch.manual_seed(0)
    base = {k: out.batch[k] for k in ("input_ids", "attention_mask", "position_ids", "responses", "response_mask")}
    base.update(old_log_probs=torch.randn(mask.shape) - 3, advantages=torch.randn(mask.shape),
                ref_log_prob=torch.randn(mask.shape) - 3)
    info = {"dp_size": 1, "batch_num_tokens": int(mask.sum()), "global_batch_size": 1}

    def loss(changed_where):
        batch = {k: v.clone() for k, v in base.items()}
        for key in ("old_log_probs", "advantages", "ref_log_prob"):
            batch[key][changed_where] += 5.0
        with torch.no_grad():
            return actor._micro_loss(batch, 1.0, info)[0].item()

    reference = loss(torch.zeros_like(tool_tokens))
    assert loss(tool_tokens) == pytest.approx(reference, abs=1e-6)
    assert abs(loss(mask.bool()) - reference) > 1e-3   # the same change on model tokens moves it


# ------------------------------------------------------------------ bad input, before Ray

def _config_with(tmp_path, **multi_turn):
    from verl.trainer.config_check import base_config

    cfg = base_config()
    for key, value in {"enable": True, **multi_turn}.items():
        OmegaConf.update(cfg, f"actor_rollout_ref.rollout.multi_turn.{key}", value)
    return cfg


def test_preflight_names_a_tool_config_that_does_not_parse(tmp_path):
    from verl.trainer.preflight import multi_turn_problems

    bad = tmp_path / "tools.yaml"
    bad.write_text("tools:\n  - class_name: [unclosed\n")
    (problem,) = multi_turn_problems(_config_with(tmp_path, tool_config_path=str(bad)))
    assert "multi_turn.tool_config_path" in problem and str(bad) in problem and "not valid YAML" in problem


def test_preflight_names_a_tool_class_that_does_not_import(tmp_path):
    from verl.trainer.preflight import multi_turn_problems

    bad = tmp_path / "tools.yaml"
    bad.write_text(TOOL_CONFIG.read_text().replace("verl.tools.gsm8k_tool.Gsm8kTool", "verl.tools.nowhere.Tool"))
    (problem,) = multi_turn_problems(_config_with(tmp_path, tool_config_path=str(bad)))
    assert str(bad) in problem and "tools[0].class_name='verl.tools.nowhere.Tool' does not import" in problem
    assert multi_turn_problems(_config_with(tmp_path, tool_config_path=str(TOOL_CONFIG))) == []
    (missing,) = multi_turn_problems(_config_with(tmp_path, tool_config_path=str(tmp_path / "none.yaml")))
    assert "multi_turn.tool_config_path" in missing and "no such file" in missing


def test_load_tools_indexes_by_name():
    tools = load_tools(OmegaConf.create({"tool_config_path": str(TOOL_CONFIG), "function_tool_path": None}))
    assert list(tools) == ["calc_gsm8k_reward"]


def test_config_check_accepts_multi_turn():
    from verl.trainer.config_check import load_config

    cfg = load_config(["actor_rollout_ref.rollout.multi_turn.enable=True",
                       f"actor_rollout_ref.rollout.multi_turn.tool_config_path={TOOL_CONFIG}",
                       "actor_rollout_ref.model.path=/some/model", "algorithm.adv_estimator=grpo",
                       "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=auto",
                       "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=auto",
                       "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=auto"])   # raises on a refused key
    assert cfg.actor_rollout_ref.rollout.multi_turn.enable is True


def test_round_length_keeps_the_batch_within_the_planned_width():
    from verl.workers.rollout.multi_turn import round_length

    cap = 10 + 20   # prompt width + response_length
    # same progress: every row may finish its budget
    assert round_length([[1] * 10, [1] * 10], [20, 20], cap) == 20
    # one row far ahead (long context, little budget) and one behind: the round stops at the cap
    assert round_length([[1] * 25, [1] * 12], [5, 18], cap) == 5
    assert round_length([[1] * 29], [1], cap) == 1


def test_a_turn_split_over_rounds_is_parsed_whole(tool_model):
    from verl.experimental.agent_loop import ToolAgentLoop

    _, _, tokenizer = tool_model
    prompt, call, tool, _ = episode_ids(tokenizer)
    tools = load_tools(OmegaConf.create({"tool_config_path": str(TOOL_CONFIG), "function_tool_path": None}))
    agent = ToolAgentLoop(_rollout_config(), tokenizer, tools, response_length=96)
    agent.start(prompt, tools_kwargs={"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": "72"}}})
    agent.extend_turn(call[:10])   # the round ended inside the call
    assert agent.context_ids == prompt + call[:10] and agent.remaining == 86 and agent.response_ids == []
    asyncio.run(agent.on_generated(agent.take_turn(call[10:]), ended=True))
    assert agent.response_ids == call + tool and agent.response_mask == [1] * len(call) + [0] * len(tool)
    assert not agent.done and agent.tool_calls_made == 1


def test_a_failing_or_malformed_call_becomes_the_tools_answer_with_reward_zero(tool_model):
    """Upstream's `_call_tool(tool_call, tools_kwargs, agent_data)` contract: an unknown name, arguments that are
    not JSON or a tool that raises give a ToolResponse naming the tool and reward 0; the turn goes on with that
    text as the tool message instead of failing the batch."""
    from verl.experimental.agent_loop import ToolAgentLoop
    from verl.experimental.agent_loop.tool_parser import FunctionCall
    from verl.tools.schemas import ToolResponse

    class Broken:
        async def create(self, create_kwargs=None):
            return "i", ToolResponse()

        async def execute(self, instance_id, parameters, **kwargs):
            raise RuntimeError("backend down")

        async def release(self, instance_id, **kwargs):
            self.released = instance_id

    _, _, tokenizer = tool_model
    prompt, call, _, _ = episode_ids(tokenizer)
    broken = Broken()
    agent = ToolAgentLoop(_rollout_config(), tokenizer, {"calc_gsm8k_reward": broken}, response_length=96)
    agent.start(prompt)
    calls = {"unknown": FunctionCall(name="calc", arguments="{}"),
             "json": FunctionCall(name="calc_gsm8k_reward", arguments="{answer: 72}"),
             "raises": FunctionCall(name="calc_gsm8k_reward", arguments='{"answer": "72"}')}
    answers = {k: asyncio.run(agent._call_tool(c, {})) for k, c in calls.items()}
    assert [reward for _, reward, _ in answers.values()] == [0.0, 0.0, 0.0]
    assert "Unknown function 'calc'" in answers["unknown"][0].text and "calc_gsm8k_reward" in answers["unknown"][0].text
    assert answers["json"][0].text.startswith("Invalid JSON in the arguments of 'calc_gsm8k_reward'")
    assert answers["raises"][0].text == "Error executing tool 'calc_gsm8k_reward': backend down"
    assert broken.released == "i"   # released even though execute raised

    asyncio.run(agent.on_generated(call, ended=True))
    expected = tool_message_ids(tokenizer, ["Error executing tool 'calc_gsm8k_reward': backend down"])
    assert agent.response_ids == call + expected and not agent.done
    assert agent.tool_calls_made == 1 and agent.tool_rewards == [0.0]


def test_function_tools_from_function_tool_path_answer_calls(tool_model, tmp_path):
    """A `@function_tool` file (function_tool_path) serves the same call: stateless, called with the arguments."""
    from verl.experimental.agent_loop import ToolAgentLoop

    _, _, tokenizer = tool_model
    prompt, call, _, _ = episode_ids(tokenizer)
    path = tmp_path / "my_tools.py"
    path.write_text("from verl.tools.function_tool import function_tool\n\n\n"
                    "@function_tool\n"
                    "def calc_gsm8k_reward(answer: str):\n"
                    '    """Grade an answer.\n\n    Args:\n        answer: the final number\n    """\n'
                    "    return f'got {answer}', 0.5\n")
    tools = load_tools(OmegaConf.create({"tool_config_path": None, "function_tool_path": str(path)}))
    agent = ToolAgentLoop(_rollout_config(), tokenizer, tools, response_length=96)
    agent.start(prompt)
    asyncio.run(agent.on_generated(call, ended=True))
    assert agent.response_ids == call + tool_message_ids(tokenizer, ["got 72"])
    assert agent.tool_rewards == [0.5]


def test_tool_messages_in_qwens_chat_template():
    """With Qwen2.5's real template, tool answers go in one user turn as <tool_response> blocks (no default
    system prompt repeated), and `<tool_call>` is a single token the Hermes parser reads back."""
    from transformers import AutoTokenizer

    from tests.shared_data import real_data

    tokenizer = AutoTokenizer.from_pretrained(str(real_data("qwen-tokenizer")))
    ids = tool_message_ids(tokenizer, ["Current parsed answer='72' reward=1.0", "second"])
    assert tokenizer.decode(ids) == ("<|im_start|>user\n<tool_response>\nCurrent parsed answer='72' reward=1.0\n"
                                     "</tool_response>\n<tool_response>\nsecond\n</tool_response><|im_end|>\n"
                                     "<|im_start|>assistant\n")
    turn = tokenizer.encode('Let me check.\n<tool_call>\n{"name": "calc_gsm8k_reward", "arguments": {"answer": '
                            '"72"}}\n</tool_call><|im_end|>', add_special_tokens=False)
    content, calls = asyncio.run(HermesToolParser(tokenizer).extract_tool_calls(turn))
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("calc_gsm8k_reward", {"answer": "72"})]
    assert content == "Let me check.\n<|im_end|>"


def test_example_preprocess_writes_upstreams_columns(tmp_path):
    """examples/data_preprocess/gsm8k_multiturn_w_tool.py on the real GSM8K files: the rows the tool loop reads."""
    import subprocess
    import sys

    import pyarrow.parquet as pq

    from tests.shared_data import real_data

    source = real_data("gsm8k")
    subprocess.run([sys.executable, "examples/data_preprocess/gsm8k_multiturn_w_tool.py", "--local_dataset_path",
                    str(source), "--local_save_dir", str(tmp_path)], cwd=REPO, check=True, timeout=120)
    row = pq.read_table(tmp_path / "test.parquet").slice(0, 1).to_pylist()[0]
    truth = row["reward_model"]["ground_truth"]
    assert row["agent_name"] == "tool_agent" and [m["role"] for m in row["prompt"]] == ["system", "user"]
    assert "calc_gsm8k_reward" in row["prompt"][0]["content"]
    assert row["extra_info"]["tools_kwargs"] == {"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": truth}}}
    assert row["extra_info"]["need_tools_kwargs"] is True


def test_tool_list_wrap_passes_tools_through_hydra_instantiate():
    """hydra.utils.instantiate would turn each tool of a plain list into a DictConfig; wrapped, the agent loop
    gets the tool objects, indexed by name."""
    import hydra

    from verl.experimental.agent_loop.agent_loop import AgentLoopBase, ToolListWrap
    from verl.tools.function_tool import FUNCTION_TOOL_REGISTRY, FunctionTool, function_tool

    @function_tool("echo_through_hydra")
    def echo(text: str) -> str:
        """Echo.

        Args:
            text: what to echo.
        """
        return text

    tool = FUNCTION_TOOL_REGISTRY["echo_through_hydra"]
    loop = hydra.utils.instantiate({"_target_": "verl.experimental.agent_loop.agent_loop.AgentLoopBase"},
                                   rollout_config=None, tokenizer=None, tools=ToolListWrap([tool]),
                                   response_length=8)
    assert isinstance(loop, AgentLoopBase)
    assert list(loop.tools) == ["echo_through_hydra"] and loop.tools["echo_through_hydra"] is tool
    assert isinstance(tool, FunctionTool)
