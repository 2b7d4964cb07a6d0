"""Where tests find the real data that is not part of the repository, and what they do without it.

The real GSM8K files (`gsm8k/train.jsonl`, `gsm8k/test.jsonl`) and the real Qwen tokenizer
(`qwen-tokenizer/`) live in one folder: the one `VERL_TEST_DATA` names, else `shared/data` beside the
checkout (where CI has it). Tests whose point is those files call `real_data(...)`, which skips the test
with one line naming the folder when a file is missing. Tests that only need "a tokenizer" or
"GSM8K-shaped rows" build their own (`tiny_tokenizer_dir`) and run everywhere.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

DATA_ENV = "VERL_TEST_DATA"
REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DATA_ROOT = REPO_ROOT.parent / "shared" / "data"


def data_root() -> Path:
    """The folder holding the real data: $VERL_TEST_DATA, else ../shared/data beside the checkout."""
    named = os.environ.get(DATA_ENV)
    return Path(named).expanduser() if named else DEFAULT_DATA_ROOT


def real_data_path(name: str) -> Path | None:
    """`name` inside the data folder (e.g. "gsm8k", "qwen-tokenizer"), or None when it is not there."""
    path = data_root() / name
    return path if path.exists() else None


def real_data(name: str) -> Path:
    """`name` inside the data folder; skips the calling test with a one-line reason when it is absent."""
    path = real_data_path(name)
    if path is None:
        pytest.skip(f"real data '{name}' not found in {data_root()} (set {DATA_ENV} to the folder that holds it)")
    return path


def tiny_tokenizer_dir(out_dir: str | Path, corpus_texts=None) -> str:
    """A byte-level BPE tokenizer with a Qwen-style chat template, built here (verl.utils.tiny_model)."""
    from verl.utils.tiny_model import build_tokenizer

    build_tokenizer(str(out_dir), corpus_texts)
    return str(out_dir)
