"""Write GSM8K for multi-turn tool rollouts (upstream's `gsm8k_multiturn_w_tool` layout): train.parquet and
test.parquet.

    python examples/data_preprocess/gsm8k_multiturn_w_tool.py --local_save_dir ~/data/gsm8k_multiturn_w_tool
    python examples/data_preprocess/gsm8k_multiturn_w_tool.py --local_dataset_path /path/to/gsm8k ...

Each row is the plain GSM8K row (see gsm8k.py) with: a system message asking the model to check its answer
with the `calc_gsm8k_reward` tool before answering; extra_info.need_tools_kwargs, extra_info.tools_kwargs
(the tool's create_kwargs carry the ground truth) and extra_info.interaction_kwargs; agent_name "tool_agent",
the agent loop that runs tool calls. Train with examples/sglang_multiturn/config/tool_config/
gsm8k_tool_config.yaml as actor_rollout_ref.rollout.multi_turn.tool_config_path.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

_spec = importlib.util.spec_from_file_location("_gsm8k_plain", Path(__file__).with_name("gsm8k.py"))
gsm8k = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gsm8k)

TOOL_NAME = "calc_gsm8k_reward"
AGENT_NAME = "tool_agent"
SYSTEM_PROMPT = (
    "You are a math expert. You are given a question and you need to solve it step by step. "
    "Reasoning step by step before any tool call. "
    f"You should use the `{TOOL_NAME}` tool after step by step solving the question, "
    "before generate final answer at least once and refine your answer if necessary. "
    "Put your final answer in the format of `#### <answer>`."
)
INSTRUCTION = "Let's think step by step and output the final answer after `####`."


def make_row(question: str, answer: str, split: str, index: int) -> dict:
    """One row: the tool's ground truth travels in extra_info.tools_kwargs, as upstream's data carries it."""
    solution = gsm8k.final_answer(answer)
    prompt = question + " " + INSTRUCTION
    return {
        "data_source": gsm8k.DATA_SOURCE,
        "agent_name": AGENT_NAME,
        "prompt": [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": prompt}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": solution},
        "extra_info": {
            "split": split,
            "index": index,
            "answer": answer,
            "question": question,
            "need_tools_kwargs": True,
            "tools_kwargs": {TOOL_NAME: {"create_kwargs": {"ground_truth": solution}}},
            "interaction_kwargs": {"query": prompt, "ground_truth": solution},
        },
    }


def make_rows(frame: pd.DataFrame, split: str) -> list[dict]:
    return [make_row(q, a, split, i) for i, (q, a) in enumerate(zip(frame["question"], frame["answer"]))]


def write_parquet(rows: list[dict], path: str) -> None:
    pq.write_table(pa.Table.from_pylist(rows), path)


def main(argv=None) -> None:
    args = gsm8k.parse_args(argv)
    save_dir = args.local_dir if args.local_dir is not None else args.local_save_dir
    if args.local_dir is not None:
        print("warning: --local_dir is deprecated, use --local_save_dir")
    save_dir = os.path.expanduser(save_dir)
    if args.hdfs_dir is not None and args.hdfs_dir.startswith("hdfs://"):
        raise SystemExit(f"--hdfs_dir {args.hdfs_dir}: HDFS upload is not built in; pass a plain directory")
    raw = gsm8k.load_local(args.local_dataset_path) if args.local_dataset_path else gsm8k.load_hub()
    os.makedirs(save_dir, exist_ok=True)
    for split in gsm8k.SPLITS:
        path = os.path.join(save_dir, f"{split}.parquet")
        write_parquet(make_rows(raw[split], split), path)
        print(f"wrote {len(raw[split])} {split} rows to {path}")
    if args.hdfs_dir is not None:
        shutil.copytree(save_dir, os.path.expanduser(args.hdfs_dir), dirs_exist_ok=True)


if __name__ == "__main__":
    main(sys.argv[1:])
