"""Build everything the demo trains on, locally: a tiny Qwen2 model and a small task in GSM8K format.

The task: the prompt asks for a digit, the answer should consist of that digit only. Rows follow the
schema `examples/data_preprocess/gsm8k.py` writes (data_source, prompt as chat messages, ability,
reward_model.ground_truth, extra_info), so the stock `main_ppo` reads them unchanged.

    python examples/demo/make_task.py OUT_DIR [--digits 0123456789] [--train-size 256]

writes OUT_DIR/model (tokenizer + random weights) and OUT_DIR/data/{train,test}.parquet.
"""
from __future__ import annotations

import argparse
import os

DATA_SOURCE = "demo/repeat_digit"


def prompt_text(digit: str) -> str:
    # The digit appears many times, so copying it only needs attention to any prompt token: a tiny
    # randomly initialised model learns that within a few dozen steps.
    return "Repeat after me: " + " ".join(digit * 8)


def make_rows(digits: str, size: int, split: str) -> list[dict]:
    rows = []
    for i in range(size):
        digit = digits[i % len(digits)]
        rows.append({
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": prompt_text(digit)}],
            "ability": "copy",
            "reward_model": {"style": "rule", "ground_truth": digit},
            "extra_info": {"split": split, "index": i},
        })
    return rows


def build(out_dir: str, digits: str = "7", train_size: int = 256, test_size: int = 32,
          hidden_size: int = 64, num_layers: int = 2) -> tuple[str, str, str]:
    """Write the model and the parquet files; return (model_dir, train_file, test_file)."""
    import pandas as pd

    from verl.utils.tiny_model import build_tiny_model_dir

    corpus = [prompt_text(d) for d in "0123456789"] + [" ".join(d * 8) + " " + d * 8 for d in "0123456789"]
    model_dir = build_tiny_model_dir(os.path.join(out_dir, "model"), corpus_texts=corpus,
                                     hidden_size=hidden_size, num_layers=num_layers)
    data_dir = os.path.join(out_dir, "data")
    os.makedirs(data_dir, exist_ok=True)
    train_file, test_file = os.path.join(data_dir, "train.parquet"), os.path.join(data_dir, "test.parquet")
    pd.DataFrame(make_rows(digits, train_size, "train")).to_parquet(train_file)
    pd.DataFrame(make_rows(digits, test_size, "test")).to_parquet(test_file)
    return model_dir, train_file, test_file


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out_dir")
    parser.add_argument("--digits", default="7", help="digits the prompts ask for (several: a harder, conditional task)")
    parser.add_argument("--train-size", type=int, default=256)
    parser.add_argument("--test-size", type=int, default=32)
    args = parser.parse_args()
    for path in build(args.out_dir, args.digits, args.train_size, args.test_size):
        print(path)
