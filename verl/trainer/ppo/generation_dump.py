"""`trainer.rollout_data_dir` / `trainer.validation_data_dir`: each step's samples as JSON lines, upstream's layout.

One file per step, `<dir>/<global_step>.jsonl`, one line per sequence with `input` (the prompt) and `output` (the
response), both decoded without special tokens, `gts` (the row's `reward_model.ground_truth`), `score` (the
sequence's summed reward), `step`, and each of the reward function's extra values that has one entry per sequence.
"""
from __future__ import annotations

import json
import os

import numpy as np


def samples(tokenizer, batch, scores) -> dict[str, list]:
    """The decoded prompts, responses, ground truths and scores of a generated batch (DataProto)."""
    gts = [row.get("ground_truth") if isinstance(row, dict) else None
           for row in batch.non_tensor_batch.get("reward_model", [None] * len(batch))]
    return {"input": tokenizer.batch_decode(batch.batch["prompts"], skip_special_tokens=True),
            "output": tokenizer.batch_decode(batch.batch["responses"], skip_special_tokens=True),
            "gts": gts, "score": [float(s) for s in scores]}


def dump(folder: str, step: int, columns: dict[str, list], extra: dict | None = None) -> str:
    """Write `columns` (equal-length lists) and the `extra` lists of the same length to `<folder>/<step>.jsonl`;
    returns the file's path."""
    rows = len(columns["input"])
    table = dict(columns, step=[step] * rows)
    for key, values in (extra or {}).items():
        values = values.tolist() if isinstance(values, np.ndarray) else list(values)
        if len(values) == rows and key not in table:
            table[key] = values
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{step}.jsonl")
    with open(path, "w", encoding="utf-8") as out:
        for i in range(rows):
            out.write(json.dumps({key: values[i] for key, values in table.items()}, ensure_ascii=False,
                                 default=str) + "\n")
    return path
