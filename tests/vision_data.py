"""Shared pieces of the vision-language tests: a tiny Qwen2.5-VL folder and a geo3k-shaped local copy.

The local copy has the hub repository's layout (data/<split>-*.parquet with problem, answer and images as
{bytes, path}); examples/data_preprocess/geo3k.py turns it into the trainer's parquet files. The GPU
runs' data (docs/performance.md) comes from the command line:
    python tests/vision_data.py OUT --rows 256 --image-size 840      # OUT/geo3k/{train,test}.parquet
"""
from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

REPO_ROOT = Path(__file__).resolve().parents[1]
# geo3k-like problems, short enough for the tiny byte-level tokenizer
PROBLEMS = ["<image>Find x.", "<image>Find the area of the figure.", "<image>Find y in the triangle.",
            "<image>Find the angle 1."]

# Qwen2.5-VL-3B-Instruct's config.json (the hub's flat layout): planner and memory tests use its shape
QWEN25_VL_3B_HUB = {
    "model_type": "qwen2_5_vl", "hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 36,
    "num_attention_heads": 16, "num_key_value_heads": 2, "vocab_size": 151936, "tie_word_embeddings": True,
    "max_position_embeddings": 128000, "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
    "vision_config": {"depth": 32, "hidden_act": "silu", "hidden_size": 1280, "intermediate_size": 3420,
                      "num_heads": 16, "in_chans": 3, "out_hidden_size": 2048, "patch_size": 14,
                      "spatial_merge_size": 2, "window_size": 112, "fullatt_block_indexes": [7, 15, 23, 31],
                      "tokens_per_second": 2, "temporal_patch_size": 2}}


def png_bytes(image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def instruction() -> str:
    """The instruction examples/data_preprocess/geo3k.py appends to every problem."""
    import runpy

    return runpy.run_path(str(REPO_ROOT / "examples" / "data_preprocess" / "geo3k.py"))["INSTRUCTION"]


def tiny_vl_model(out_dir) -> str:
    """A tiny Qwen2.5-VL whose tokenizer was trained on the problems and the instruction (short prompts)."""
    from tiny_vl_model import build_tiny_vl_model_dir

    corpus = [p + " " + instruction() for p in PROBLEMS] * 4
    return build_tiny_vl_model_dir(str(out_dir), corpus_texts=corpus, vocab_size=1024, seed=0)


def write_hub_copy(folder, rows_per_split: int = 8, seed: int = 0, image_size: int = 56) -> Path:
    """A geometry3k-shaped copy of the hub repository in `folder`, one random image per problem."""
    from tiny_vl_model import tiny_images

    data = Path(folder) / "data"
    data.mkdir(parents=True, exist_ok=True)
    for offset, split in enumerate(("train", "validation", "test")):
        images = tiny_images(rows_per_split, size=image_size, seed=seed + offset)
        records = [{"problem": PROBLEMS[i % len(PROBLEMS)], "answer": str(i),
                    "images": [{"bytes": png_bytes(images[i]), "path": None}]} for i in range(rows_per_split)]
        pq.write_table(pa.Table.from_pylist(records), data / f"{split}-00000-of-00001.parquet")
    return Path(folder)


def geo3k_parquet(tmp_dir, rows_per_split: int = 8, image_size: int = 56) -> Path:
    """train.parquet / test.parquet written by the stock preprocessing script from a local copy."""
    source = write_hub_copy(Path(tmp_dir) / "geometry3k", rows_per_split, image_size=image_size)
    out = Path(tmp_dir) / "geo3k"
    subprocess.run([sys.executable, "examples/data_preprocess/geo3k.py", "--local_dataset_path", str(source),
                    "--local_save_dir", str(out)], cwd=REPO_ROOT, check=True, timeout=120)
    return out


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="geo3k-shaped parquet files with random images")
    parser.add_argument("out")
    parser.add_argument("--rows", type=int, default=8, help="rows per split")
    parser.add_argument("--image-size", type=int, default=56, help="pixels a side (840: ~900 Qwen2.5-VL image tokens)")
    args = parser.parse_args()
    print(geo3k_parquet(args.out, args.rows, args.image_size))
