"""Upstream's device helpers, answered by verl.compat (the plan in force, else the detected device),
so code written against upstream's accelerator-agnostic API runs unchanged on every device compat
supports. Nothing here probes the hardware itself."""
from __future__ import annotations

import torch

from verl.compat.apply.device_names import current_names

__all__ = ["get_device_id", "get_device_name", "get_nccl_backend", "get_torch_device", "is_cuda_available",
           "is_npu_available"]

is_npu_available = False   # Ascend NPUs are not supported by this build


def _is_cuda() -> bool:
    return current_names()[0] == "cuda"


def get_device_name() -> str:
    """"cuda" (also on ROCm) or "cpu"."""
    return current_names()[0]


def get_torch_device():
    """The torch module of the device type (`torch.cuda` or `torch.cpu`)."""
    return torch.get_device_module(get_device_name())


def get_device_id() -> int:
    """The current device index (0 on the CPU)."""
    return torch.cuda.current_device() if _is_cuda() else 0


def get_nccl_backend() -> str:
    """The torch.distributed backend the plan uses for this device (gloo on the CPU)."""
    return current_names()[1]


def __getattr__(name: str):
    if name == "is_cuda_available":   # a module attribute in upstream, computed on first use here
        return _is_cuda()
    raise AttributeError(name)
