"""A tiny Qwen2 model trained (a few hundred Adam steps on CPU) to play one GSM8K tool episode greedily:
after the example's prompt it writes a Hermes tool call to `calc_gsm8k_reward`, and after the tool's
response it writes the final answer. A random tiny model never calls a tool, so tests of the multi-turn
rollout use this one: every token it emits comes from the real model through the real engine."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import torch

from verl.experimental.agent_loop.tool_agent_loop import tool_message_ids
from verl.utils.tiny_model import DEFAULT_CORPUS, build_tiny_model_dir

REPO = Path(__file__).resolve().parents[2]
QUESTION = ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
            "How many clips did Natalia sell altogether in April and May?")
ANSWER = "Natalia sold 48/2 = 24 clips in May.\nNatalia sold 48+24 = 72 clips altogether.\n#### 72"
TOOL_CALL = '<tool_call>\n{"name": "calc_gsm8k_reward", "arguments": {"answer": "72"}}\n</tool_call>'
TOOL_TEXT = "Current parsed answer='72' reward=1.0"   # what Gsm8kTool answers to a right "72"
FINAL = "The answer is #### 72"


def example_module():
    """examples/data_preprocess/gsm8k_multiturn_w_tool.py, imported from its file."""
    path = REPO / "examples" / "data_preprocess" / "gsm8k_multiturn_w_tool.py"
    spec = importlib.util.spec_from_file_location("gsm8k_multiturn_w_tool", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def episode_ids(tokenizer) -> tuple[list[int], list[int], list[int], list[int]]:
    """(prompt, model's tool-call turn, tool message, model's final turn) as the rollout sees them."""
    row = example_module().make_row(QUESTION, ANSWER, "train", 0)
    prompt_text = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False)
    prompt = tokenizer.encode(prompt_text, add_special_tokens=False)
    call = tokenizer.encode(TOOL_CALL, add_special_tokens=False) + [tokenizer.eos_token_id]
    tool = tool_message_ids(tokenizer, [TOOL_TEXT])
    final = tokenizer.encode(FINAL, add_special_tokens=False) + [tokenizer.eos_token_id]
    return prompt, call, tool, final


def build_tool_calling_model(out_dir: str, steps: int = 300) -> str:
    """Write the tokenizer and a model whose greedy continuation of the example's prompt is the episode."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    mod = example_module()
    corpus = list(DEFAULT_CORPUS) + [mod.SYSTEM_PROMPT, QUESTION + " " + mod.INSTRUCTION, TOOL_CALL, TOOL_TEXT, FINAL]
    # head_dim 32: the smallest vLLM's CPU attention kernels take, so the vLLM engine runs it too
    build_tiny_model_dir(out_dir, corpus, hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1, seed=0)
    tokenizer = AutoTokenizer.from_pretrained(out_dir)
    model = AutoModelForCausalLM.from_pretrained(out_dir, dtype=torch.float32)
    prompt, call, tool, final = episode_ids(tokenizer)
    ids = torch.tensor([prompt + call + tool + final])
    labels = torch.full_like(ids, -100)
    start = len(prompt)
    labels[0, start:start + len(call)] = ids[0, start:start + len(call)]
    start += len(call) + len(tool)
    labels[0, start:] = ids[0, start:]
    torch.manual_seed(0)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        loss = model(input_ids=ids, labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.save_pretrained(out_dir)
    return out_dir
