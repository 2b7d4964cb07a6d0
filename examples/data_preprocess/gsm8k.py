"""Write GSM8K as the parquet files the trainer reads: train.parquet and test.parquet.

    python examples/data_preprocess/gsm8k.py --local_save_dir ~/data/gsm8k
    python examples/data_preprocess/gsm8k.py --local_dataset_path /path/to/gsm8k --local_save_dir ~/data/gsm8k

Each row: data_source "openai/gsm8k"; prompt = one user message (question + instruction); ability "math";
reward_model {style: rule, ground_truth: the number after "####", commas removed}; extra_info {split,
index, answer, question}. The same schema as upstream verl, so its data and ours are interchangeable.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

DATA_SOURCE = "openai/gsm8k"
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
SPLITS = ("train", "test")
_FINAL_ANSWER = re.compile(r"#### (-?[0-9.,]+)")


def final_answer(answer: str) -> str:
    """The label: the number after "####" in a GSM8K solution, without thousands separators."""
    match = _FINAL_ANSWER.search(answer)
    if match is None:
        raise ValueError(f"GSM8K answer has no '#### <number>' line: {answer[-200:]!r}")
    return match.group(1).replace(",", "")


def make_rows(questions_and_answers: pd.DataFrame, split: str) -> list[dict]:
    """One training row per problem, in upstream's schema."""
    rows = []
    for index, (question, answer) in enumerate(
        zip(questions_and_answers["question"], questions_and_answers["answer"])
    ):
        rows.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": question + " " + INSTRUCTION}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": final_answer(answer)},
                "extra_info": {"split": split, "index": index, "answer": answer, "question": question},
            }
        )
    return rows


def _read_table(path: Path) -> pd.DataFrame:
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        names = set(pq.read_schema(path).names)   # this script's own output lacks both: say so, not pyarrow
        frame = pd.read_parquet(path, columns=["question", "answer"]) if {"question", "answer"} <= names \
            else pd.DataFrame(columns=sorted(names))
    else:
        frame = pd.read_json(path, lines=path.suffix == ".jsonl", dtype=False)
    missing = {"question", "answer"} - set(frame.columns)
    if missing:
        raise ValueError(f"{path} lacks the column(s) {sorted(missing)}; GSM8K files have 'question' and 'answer' "
                         "(files this script wrote are not its input: keep the source files in a folder of their own)")
    return frame[["question", "answer"]]


def load_local(folder: str) -> dict[str, pd.DataFrame]:
    """Read train/test from a folder of .jsonl/.json/.parquet files, told apart by file name.

    A copy of the hub repository holds "main" and "socratic" variants; "main" is used, as from the hub.
    """
    root = Path(folder).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"--local_dataset_path {folder!r} is not a folder")
    if (root / "main").is_dir():
        root = root / "main"
    suffixes = (".jsonl", ".json", ".parquet")
    files = sorted(p for p in root.rglob("*") if p.suffix in suffixes and "socratic" not in p.parts)
    splits = {}
    for split in SPLITS:
        chosen = [p for p in files if p.name.startswith(split)]
        if not chosen:
            raise FileNotFoundError(
                f"no {split} file in {root}: expected a .jsonl, .json or .parquet file whose name starts with "
                f"{split!r} (found: {[p.name for p in files]})"
            )
        splits[split] = pd.concat([_read_table(p) for p in chosen], ignore_index=True)
    return splits


def load_hub() -> dict[str, pd.DataFrame]:
    """Download openai/gsm8k ("main" config) through the datasets library, as upstream does."""
    import datasets

    dataset = datasets.load_dataset(DATA_SOURCE, "main")
    return {split: dataset[split].to_pandas() for split in SPLITS}


# Spelled out so the struct fields keep upstream's order: pyarrow 14-23 (measured) sort inferred struct fields.
SCHEMA = pa.schema([
    ("data_source", pa.string()),
    ("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
    ("ability", pa.string()),
    ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
    ("extra_info", pa.struct([("split", pa.string()), ("index", pa.int64()), ("answer", pa.string()),
                              ("question", pa.string())])),
])


def write_parquet(rows: list[dict], path: str) -> None:
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), path)




def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--local_save_dir", default="~/data/gsm8k", help="where train.parquet/test.parquet go")
    parser.add_argument("--local_dir", default=None, help="deprecated name of --local_save_dir")
    parser.add_argument("--local_dataset_path", default=None, help="folder with a local copy of GSM8K (skips the hub)")
    parser.add_argument("--hdfs_dir", default=None, help="also copy the output folder to this directory")
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    save_dir = args.local_save_dir
    if args.local_dir is not None:
        print("warning: --local_dir is deprecated, use --local_save_dir")
        save_dir = args.local_dir
    save_dir = os.path.expanduser(save_dir)
    if args.hdfs_dir is not None and args.hdfs_dir.startswith("hdfs://"):
        # Upstream's --hdfs_dir copy; this fork copies to plain directories only. Fail before any work.
        raise SystemExit(
            f"--hdfs_dir {args.hdfs_dir}: HDFS upload is not built in; pass a plain directory, or copy "
            f"{save_dir} afterwards with `hdfs dfs -put`"
        )

    raw = load_local(args.local_dataset_path) if args.local_dataset_path else load_hub()
    os.makedirs(save_dir, exist_ok=True)
    for split in SPLITS:
        path = os.path.join(save_dir, f"{split}.parquet")
        write_parquet(make_rows(raw[split], split), path)
        print(f"wrote {len(raw[split])} {split} rows to {path}")

    if args.hdfs_dir is not None:
        shutil.copytree(save_dir, os.path.expanduser(args.hdfs_dir), dirs_exist_ok=True)


if __name__ == "__main__":
    main()
