"""Upstream's `verl.utils.transformers_compat`: a transformers version check and the vision-language auto class
across transformers versions. The FSDP engine helpers (`unpack_visual_output`, `drop_tied_target_keys`) raise
NotImplementedError: they serve upstream's engine-based workers."""
from __future__ import annotations

import importlib.metadata
from functools import lru_cache

from packaging.version import Version

from verl._unsupported import stand_in

__all__ = ["get_auto_model_for_vision2seq", "is_transformers_version_in_range"]

__getattr__ = stand_in(__name__, "the engine-based workers' transformers helpers")


@lru_cache
def is_transformers_version_in_range(min_version: str | None = None, max_version: str | None = None) -> bool:
    """Whether the installed transformers lies in [min_version, max_version] (either bound may be None)."""
    try:
        installed = Version(importlib.metadata.version("transformers"))
    except importlib.metadata.PackageNotFoundError as err:
        raise ModuleNotFoundError("transformers is not installed") from err
    return ((min_version is None or Version(min_version) <= installed)
            and (max_version is None or installed <= Version(max_version)))


@lru_cache
def get_auto_model_for_vision2seq():
    """`AutoModelForImageTextToText` where transformers has it, else the older `AutoModelForVision2Seq`."""
    try:
        from transformers import AutoModelForImageTextToText
    except ImportError:
        from transformers import AutoModelForVision2Seq

        return AutoModelForVision2Seq
    return AutoModelForImageTextToText
