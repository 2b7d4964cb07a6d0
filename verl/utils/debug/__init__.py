"""Debugging helpers (upstream's `verl.utils.debug`): rollout-vs-actor probability metrics and timers."""
from verl.utils.debug.metrics import calculate_debug_metrics
from verl.utils.debug.performance import simple_timer

__all__ = ["calculate_debug_metrics", "simple_timer"]
