"""Built-in rule rewards, chosen by a sample's `data_source` (the dataset's `data_source` column)."""

from __future__ import annotations

import warnings

from . import gsm8k

# data_source -> scorer(solution_str, ground_truth). Everything else needs a user reward function.
_SCORERS = {
    "openai/gsm8k": gsm8k.compute_score,
}


def default_compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """Score one response with the rule for its data source.

    Returns a float, or the scorer's dict unchanged (a dict carries "score" plus extra metrics).
    `extra_info` and extra keyword arguments (upstream passes sandbox settings) are accepted so the call
    signature matches upstream's; the built-in rules do not use them.
    """
    scorer = _SCORERS.get(data_source)
    if scorer is None:
        raise NotImplementedError(
            f"No built-in reward for data_source={data_source!r} (built in: {sorted(_SCORERS)}). "
            "Write a reward function and point custom_reward_function.path (and .name, default "
            "'compute_score') at it, or fix the data_source column of your data."
        )
    result = scorer(solution_str, ground_truth)
    return result if isinstance(result, dict) else float(result)


def _default_compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """Old name kept for scripts written against earlier verl releases."""
    warnings.warn(
        "verl.utils.reward_score._default_compute_score is deprecated; use default_compute_score",
        DeprecationWarning,
        stacklevel=2,
    )
    return default_compute_score(data_source, solution_str, ground_truth, extra_info, **kwargs)


__all__ = ["default_compute_score"]
