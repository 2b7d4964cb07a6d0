"""Metric reduction as upstream's `verl.utils.metric.utils`: `reduce_metrics` over per-micro-batch lists, and
`Metric`, a list of values that knows how it aggregates (mean, sum, min or max), also across data-parallel
ranks."""
from __future__ import annotations

from enum import Enum
from typing import Any, Optional, Union

import numpy as np
import torch

__all__ = ["reduce_metrics", "AggregationType", "Metric"]


class AggregationType(Enum):
    MEAN = "mean"
    SUM = "sum"
    MIN = "min"
    MAX = "max"


_REDUCE = {AggregationType.MEAN: np.mean, AggregationType.SUM: np.sum, AggregationType.MIN: np.min,
           AggregationType.MAX: np.max}
_NUMERIC = (int, float, np.number, np.ndarray, torch.Tensor)


class Metric:
    """Values collected over micro-batches with the way they combine into one number."""

    def __init__(self, aggregation: Union[str, AggregationType], value=None) -> None:
        try:
            self.aggregation = AggregationType(aggregation)
        except ValueError as exc:
            raise ValueError(f"Unsupported aggregation type: {aggregation}; use one of "
                             f"{[a.value for a in AggregationType]}") from exc
        self.values: list = []
        if value is not None:
            self.append(value) if not isinstance(value, list) else self.extend(value)

    def append(self, value) -> None:
        """Add one number (a one-element tensor is read out); another Metric adds all its values."""
        if isinstance(value, Metric):
            self.extend(value)
            return
        if isinstance(value, torch.Tensor):
            if value.numel() != 1:
                raise ValueError("Only scalar tensors can be converted to float")
            value = value.detach().item()
        if not isinstance(value, _NUMERIC):
            raise ValueError(f"Unsupported value type: {type(value)}")
        self.values.append(value)

    def extend(self, values) -> None:
        if isinstance(values, Metric):
            if values.aggregation != self.aggregation:
                raise ValueError(f"Aggregation type mismatch: {self.aggregation} != {values.aggregation}")
            values = values.values
        for value in values:
            self.append(value)

    def aggregate(self) -> float:
        return _REDUCE[self.aggregation](self.values)

    @classmethod
    def aggregate_dp(cls, metric_lists: list["Metric"]) -> float:
        """One number from the same metric on every data-parallel rank: sums and means average the ranks'
        per-step values first (each rank saw a share of the batch); min and max look at every value."""
        if not metric_lists:
            raise ValueError("Cannot aggregate an empty list of metrics.")
        lengths = [len(m.values) for m in metric_lists]
        if len(set(lengths)) != 1:
            raise ValueError(f"All Metric instances must have the same number of values for dp aggregation: {lengths}")
        table = np.array([m.values for m in metric_lists])
        kind = metric_lists[0].aggregation
        if kind in (AggregationType.SUM, AggregationType.MEAN):
            return _REDUCE[kind](table.mean(axis=0))
        return _REDUCE[kind](table.ravel())

    @classmethod
    def from_dict(cls, data: dict[str, Any], aggregation: Union[str, AggregationType]) -> dict[str, "Metric"]:
        return {key: cls(aggregation, value) for key, value in data.items()}

    def init_list(self) -> "Metric":
        """An empty Metric with the same aggregation (what `append_to_dict` starts a key with)."""
        return Metric(self.aggregation)


def reduce_metrics(metrics: dict[str, Any]) -> dict[str, Any]:
    """Per key: a Metric's own aggregate; else the max of the values if the name contains "max", the min if it
    contains "min", else the mean. Updates `metrics` in place and returns it (upstream's contract)."""
    for key, values in metrics.items():
        if isinstance(values, Metric):
            metrics[key] = values.aggregate()
            continue
        if isinstance(values, torch.Tensor):
            values = values.detach().float().cpu().numpy()
        reduce = np.max if "max" in key else np.min if "min" in key else np.mean
        metrics[key] = reduce(values)
    return metrics
