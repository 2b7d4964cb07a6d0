"""Metric reduction under upstream's import path."""
from verl.utils.metric.utils import AggregationType, Metric, reduce_metrics

__all__ = ["reduce_metrics", "AggregationType", "Metric"]
