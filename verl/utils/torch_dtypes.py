"""Precision spellings (upstream's `verl.utils.torch_dtypes`), answered by verl.compat's one dtype table."""
from __future__ import annotations

import torch

from verl.compat.apply.apply_plan import torch_dtype
from verl.compat.planning.settings import dtype_name

__all__ = ["HALF_LIST", "FLOAT_LIST", "BFLOAT_LIST", "PrecisionType"]

_BF = torch_dtype("bf16")
HALF_LIST = [16, "16", "fp16", "float16", torch.float16]
FLOAT_LIST = [32, "32", "fp32", "float32", torch.float32]
BFLOAT_LIST = ["bf16", dtype_name("bf16"), _BF]
_SHORT = {torch.float16: "fp16", torch.float32: "fp32", _BF: "bf16"}


class PrecisionType:
    """Precision names and conversions between spellings and torch dtypes."""

    HALF = "16"
    FLOAT = "32"
    FULL = "64"
    BFLOAT = "bf16"
    MIXED = "mixed"

    @staticmethod
    def supported_types() -> list[str]:
        return [PrecisionType.HALF, PrecisionType.FLOAT, PrecisionType.FULL, PrecisionType.BFLOAT, PrecisionType.MIXED]

    @staticmethod
    def supported_type(precision) -> bool:
        return str(precision) in PrecisionType.supported_types()

    @staticmethod
    def is_fp16(precision) -> bool:
        return precision in HALF_LIST

    @staticmethod
    def is_fp32(precision) -> bool:
        return precision in FLOAT_LIST

    @staticmethod
    def is_bf16(precision) -> bool:
        return precision in BFLOAT_LIST

    @staticmethod
    def to_dtype(precision) -> torch.dtype:
        for spellings, dtype in ((HALF_LIST, torch.float16), (FLOAT_LIST, torch.float32), (BFLOAT_LIST, _BF)):
            if precision in spellings:
                return dtype
        raise RuntimeError(f"unexpected precision: {precision}")

    @staticmethod
    def to_str(precision) -> str:
        if precision not in _SHORT:
            raise RuntimeError(f"unexpected precision: {precision}")
        return _SHORT[precision]
