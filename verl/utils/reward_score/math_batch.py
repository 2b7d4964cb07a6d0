"""A batched reward function (the signature `reward.reward_manager.name=batch` calls) over `math_reward`."""
from verl.utils.reward_score.math_reward import compute_score

__all__ = ["compute_score_batched"]


def compute_score_batched(data_sources, solution_strs, ground_truths, extra_infos):
    """One `math_reward` score per response."""
    return [compute_score(s, g) for s, g in zip(solution_strs, ground_truths, strict=True)]
