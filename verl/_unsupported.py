"""Importable stand-ins for upstream modules whose feature this verl does not have.

Code written for upstream imports them without error (so a plugin that only mentions them still loads), and the
first use of any name they should hold raises `UnsupportedFeatureError`, which names the feature. It is both a
NotImplementedError and an ImportError, so `try: from verl.x import Y / except ImportError:` feature checks keep
working. Each such module sets `__verl_unsupported__` to the feature's name; tests/upstream/api_report.py counts
them apart from working modules, and docs/upstream/compatibility.md lists them.
"""
from __future__ import annotations

__all__ = ["UnsupportedFeatureError", "stand_in"]


class UnsupportedFeatureError(ImportError, NotImplementedError):
    """A name from an upstream feature this verl does not have."""


def stand_in(module_name: str, feature: str):
    """A module-level `__getattr__` for `module_name`: every public name raises UnsupportedFeatureError."""

    def __getattr__(name: str):
        if name.startswith("__") and name.endswith("__"):  # import machinery and tools probe these
            raise AttributeError(name)
        raise UnsupportedFeatureError(f"{module_name}.{name}: {feature} is not supported by this verl (it trains with "
                                      "FSDP2 and rolls out with its HF engine or vLLM); see "
                                      "docs/upstream/compatibility.md", name=module_name)

    return __getattr__
