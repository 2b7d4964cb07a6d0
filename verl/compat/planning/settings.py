"""Reading the user's settings: one lookup for every compat module and one table of dtype spellings.

The config may be an OmegaConf DictConfig or a plain dict (hosts without omegaconf plan from
dicts). A key that is missing, None or "auto" reads as "left to compat" (`AUTO`, or the default
the caller gives).
"""
from __future__ import annotations

import copy
from typing import Any

AUTO = object()

# Every spelling of a dtype the config keys accept, and the torch attribute name it means.
DTYPE_SPELLINGS = {
    "float32": "float32", "fp32": "float32", "float": "float32", "f32": "float32",
    "float16": "float16", "fp16": "float16", "half": "float16", "f16": "float16",
    "bfloat16": "bfloat16", "bf16": "bfloat16",
}


def dtype_name(value: Any) -> str:
    """ "bf16" / "torch.float16" / "half" ... -> "bfloat16" / "float16"; ValueError when unknown."""
    key = str(value).strip().lower().removeprefix("torch.")
    if key not in DTYPE_SPELLINGS:
        raise ValueError(f"Unknown dtype '{value}'; use one of {', '.join(sorted(DTYPE_SPELLINGS))} (or auto).")
    return DTYPE_SPELLINGS[key]


def raw(config: Any, path: str) -> Any:
    """`config.a.b` for path "a.b" as written (None when missing; "auto" stays "auto")."""
    node = config
    for key in path.split("."):
        if node is None:
            return None
        try:
            node = node.get(key)
        except (AttributeError, TypeError):
            node = getattr(node, key, None)
    return node


def get(config: Any, path: str, default: Any = AUTO) -> Any:
    """`config.a.b` for path "a.b"; missing, None and "auto" read as `default`."""
    node = raw(config, path)
    if node is None or (isinstance(node, str) and node.strip().lower() == "auto"):
        return default
    return node


def first_with_path(config: Any, *paths: str) -> tuple[str, Any]:
    """The first of `paths` the user set, and its value; (paths[0], AUTO) when none is set."""
    for path in paths:
        value = get(config, path)
        if value is not AUTO:
            return path, value
    return paths[0], AUTO


def first(config: Any, *paths: str) -> Any:
    return first_with_path(config, *paths)[1]


def flag(value: Any) -> Any:
    """A boolean setting: AUTO and bools pass through; "true"/"1"/"yes"/"on" read as True."""
    if value is AUTO or isinstance(value, bool):
        return value
    return str(value).strip().lower() in ("1", "true", "yes", "on")


def with_values(config: Any, values: dict[str, Any]) -> Any:
    """A copy of `config` with each dotted path in `values` set (missing sections are created); the
    original is untouched. Works on a plain dict and on an OmegaConf DictConfig alike."""
    out = copy.deepcopy(config)
    if not isinstance(out, dict):   # an OmegaConf DictConfig (maybe in struct mode): its own setter
        from omegaconf import OmegaConf

        for path, value in values.items():
            OmegaConf.update(out, path, value, force_add=True)
        return out
    for path, value in values.items():
        *parents, leaf = path.split(".")
        node = out
        for key in parents:
            child = node.get(key) if hasattr(node, "get") else None
            if child is None:
                node[key] = {}
                child = node[key]
            node = child
        node[leaf] = value
    return out
