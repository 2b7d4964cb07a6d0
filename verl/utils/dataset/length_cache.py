"""Prompt token counts kept on disk between runs (`~/.cache/verl/prompt_lengths`).

Before training starts the driver counts the tokens of every chat-formatted prompt (the over-long check
and filter): one chat-template render and one encoding per row, seconds for GSM8K's 8.8k prompts, paid
again by every run over the same data. The counts are a pure function of the data files' bytes, the rows
taken from them, the prompt column, the tokenizer (its whole serialised vocabulary and rules) and the chat
template with its arguments; keyed by a hash of all of those, a later run reads them instead. A cache that
cannot be read or written is skipped: the counts are then computed as before.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile

import numpy as np

from verl.utils.startup.bytecode_cache import cache_dir

FOLDER = "prompt_lengths"


def lengths_key(files: list[str], rows: np.ndarray, prompt_key: str, tokenizer, template_kwargs: dict) -> str | None:
    """The hash the counts are kept under, or None where there is nothing exact to key on (a tokenizer without
    a fast backend to serialise, a data file that is not a local file)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    try:
        vocabulary = backend.to_str() if backend is not None else None
    except Exception:  # noqa: BLE001 - a backend that cannot serialise itself: no exact key, no cache
        vocabulary = None
    if vocabulary is None:
        return None
    digest = hashlib.sha256()
    for path in files:
        full = os.path.expanduser(path)
        if not os.path.isfile(full):
            return None
        with open(full, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 24), b""):
                digest.update(block)
    digest.update(np.ascontiguousarray(rows, dtype=np.int64).tobytes())
    digest.update(hashlib.sha256(vocabulary.encode()).digest())
    rendering = [prompt_key, getattr(tokenizer, "chat_template", None), template_kwargs]
    digest.update(json.dumps(rendering, sort_keys=True, default=str).encode())
    return digest.hexdigest()


def _path(key: str) -> str:
    return os.path.join(cache_dir(FOLDER), key + ".npy")


def load(key: str, rows: int) -> np.ndarray | None:
    """The counts kept under `key`, if there are `rows` of them."""
    try:
        lengths = np.load(_path(key), allow_pickle=False)
    except (OSError, ValueError):
        return None
    return lengths if lengths.shape == (rows,) and lengths.dtype == np.int64 else None


def store(key: str, lengths: np.ndarray) -> None:
    """Keep `lengths` under `key` (written whole or not at all)."""
    folder = cache_dir(FOLDER)
    try:
        os.makedirs(folder, exist_ok=True)
        handle, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
    except OSError:
        return
    try:
        with os.fdopen(handle, "wb") as out:
            np.save(out, np.asarray(lengths, dtype=np.int64), allow_pickle=False)
        os.replace(tmp, _path(key))
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
