"""Write Geometry3K (hiyouga/geometry3k) as the parquet files the trainer reads: train.parquet and test.parquet.

    python examples/data_preprocess/geo3k.py --local_save_dir ~/data/geo3k
    python examples/data_preprocess/geo3k.py --local_dataset_path /path/to/geometry3k --local_save_dir ~/data/geo3k

Each row, in upstream verl's schema: data_source "hiyouga/geometry3k"; prompt = one user message whose text is
the problem (it holds an `<image>` placeholder per figure) and an instruction to reason in <think> tags and
box the answer; images = the figures as {bytes, path}; ability "math"; reward_model {style: rule,
ground_truth: the answer}; extra_info {split, index, answer, question}.
"""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

DATA_SOURCE = "hiyouga/geometry3k"
INSTRUCTION = (r"Reason through the problem first, inside <think> </think> tags, as an inner monologue; "
               r"then give the final answer inside \boxed{}.")
SPLITS = ("train", "test")
COLUMNS = ("problem", "answer", "images")

IMAGE = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
SCHEMA = pa.schema([
    ("data_source", pa.string()),
    ("prompt", pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))),
    ("images", pa.list_(IMAGE)),
    ("ability", pa.string()),
    ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
    ("extra_info", pa.struct([("split", pa.string()), ("index", pa.int64()), ("answer", pa.string()),
                              ("question", pa.string())])),
])


def _image_cell(value) -> dict:
    """One figure as {bytes, path}: a datasets.Image cell as stored in parquet, or a PIL image."""
    if isinstance(value, dict):
        return {"bytes": value.get("bytes"), "path": value.get("path")}
    import io

    buffer = io.BytesIO()
    value.save(buffer, format="PNG")
    return {"bytes": buffer.getvalue(), "path": None}


def make_rows(records: list[dict], split: str) -> list[dict]:
    """One training row per problem."""
    rows = []
    for index, record in enumerate(records):
        problem, answer = record["problem"], record["answer"]
        rows.append({
            "data_source": DATA_SOURCE,
            "prompt": [{"role": "user", "content": problem + " " + INSTRUCTION}],
            "images": [_image_cell(image) for image in record["images"] or []],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": answer},
            "extra_info": {"split": split, "index": index, "answer": answer, "question": problem},
        })
    return rows


def load_local(folder: str) -> dict[str, list[dict]]:
    """train/test records from a folder holding a copy of the hub repository (parquet files whose
    names start with the split, e.g. data/train-00000-of-00001.parquet)."""
    root = Path(folder).expanduser()
    if not root.is_dir():
        raise FileNotFoundError(f"--local_dataset_path {folder!r} is not a folder")
    files = sorted(root.rglob("*.parquet"))
    splits = {}
    for split in SPLITS:
        chosen = [p for p in files if p.name.startswith(split)]
        if not chosen:
            raise FileNotFoundError(f"no {split} file in {root}: expected a .parquet file whose name starts with "
                                    f"{split!r} (found: {[p.name for p in files]})")
        records = []
        for path in chosen:
            table = pq.read_table(path)
            missing = set(COLUMNS) - set(table.column_names)
            if missing:
                raise ValueError(f"{path} lacks the column(s) {sorted(missing)}; Geometry3K files have {COLUMNS}")
            records += table.select(list(COLUMNS)).to_pylist()
        splits[split] = records
    return splits


def load_hub() -> dict[str, list[dict]]:
    """Download hiyouga/geometry3k through the datasets library, as upstream does."""
    import datasets

    dataset = datasets.load_dataset(DATA_SOURCE)
    return {split: [dict(zip(COLUMNS, values)) for values in zip(*(dataset[split][c] for c in COLUMNS))]
            for split in SPLITS}


def write_parquet(rows: list[dict], path: str) -> None:
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), path)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--local_save_dir", default="~/data/geo3k", help="where train.parquet/test.parquet go")
    parser.add_argument("--local_dir", default=None, help="deprecated name of --local_save_dir")
    parser.add_argument("--local_dataset_path", default=None,
                        help="folder with a local copy of hiyouga/geometry3k (skips the hub)")
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
        raise SystemExit(f"--hdfs_dir {args.hdfs_dir}: HDFS upload is not built in; pass a plain directory, or "
                         f"copy {save_dir} afterwards with `hdfs dfs -put`")

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
