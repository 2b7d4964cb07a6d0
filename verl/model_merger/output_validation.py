"""Upstream's `verl.model_merger.output_validation`: is a merged folder a complete Hugging Face model? A
non-empty `config.json` holding a JSON object, and weights: a whole `model.safetensors` / `pytorch_model.bin`,
or an index whose every shard is a non-empty file inside the folder."""
from __future__ import annotations

import json
from pathlib import Path, PurePosixPath

__all__ = ["validate_hf_model_output"]

_WHOLE = ("model.safetensors", "pytorch_model.bin")
_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")


def _filled(path: Path) -> bool:
    return path.is_file() and path.stat().st_size > 0


def _index_problem(folder: Path, name: str) -> str | None:
    """What is wrong with the index file `name` (None: it and all its shards are there)."""
    try:
        index = json.loads((folder / name).read_text(encoding="utf-8"))
    except (OSError, UnicodeError, ValueError) as err:
        return f"{name} does not parse: {err}"
    shards = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(shards, dict) or not shards:
        return f"{name} has no weight_map entries"
    files = set(shards.values())
    if not all(isinstance(f, str) and f for f in files):
        return f"{name} names a shard that is not a file name"
    outside = sorted(f for f in files if PurePosixPath(f).is_absolute() or ".." in PurePosixPath(f).parts)
    if outside:
        return f"{name} names shards outside the folder: {outside}"
    missing = sorted(f for f in files if not _filled(folder.joinpath(*PurePosixPath(f).parts)))
    return f"{name} names missing or empty shards: {missing}" if missing else None


def validate_hf_model_output(target_dir) -> None:
    """Raise RuntimeError naming every problem when `target_dir` is not a complete Hugging Face model folder."""
    folder = Path(target_dir)
    problems = []
    config = folder / "config.json"
    if not _filled(config):
        problems.append("config.json is missing or empty")
    else:
        try:
            if not isinstance(json.loads(config.read_text(encoding="utf-8")), dict):
                problems.append("config.json is not a JSON object")
        except (OSError, UnicodeError, ValueError) as err:
            problems.append(f"config.json does not parse: {err}")
    if not any(_filled(folder / name) for name in _WHOLE):
        index_problems = [_index_problem(folder, name) for name in _INDEXES if (folder / name).exists()]
        if not index_problems or all(index_problems):
            problems += [p for p in index_problems if p]
            problems.append(f"no complete weights (one of {', '.join(_WHOLE + _INDEXES)})")
    if problems:
        raise RuntimeError(f"{folder} is not a complete Hugging Face model: {'; '.join(problems)}")
