"""Reduce per-micro-batch metric lists to one number each, as upstream's `reduce_metrics` does."""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = ["reduce_metrics"]


def reduce_metrics(metrics: dict[str, Any]) -> dict[str, Any]:
    """Per key: the max of the values if the name contains "max", else the min if it contains "min",
    else the mean. Updates `metrics` in place and returns it (upstream's contract)."""
    for key, values in metrics.items():
        if isinstance(values, torch.Tensor):
            values = values.detach().float().cpu().numpy()
        reduce = np.max if "max" in key else np.min if "min" in key else np.mean
        metrics[key] = reduce(values)
    return metrics
