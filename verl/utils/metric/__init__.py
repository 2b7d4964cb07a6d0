"""`reduce_metrics` under upstream's import path."""
from verl.utils.metric.utils import reduce_metrics

__all__ = ["reduce_metrics"]
