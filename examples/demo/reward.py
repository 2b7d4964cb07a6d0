"""Reward of the demo task: how much of the answer is the digit the prompt asks for.

Used through the stock config: `custom_reward_function.path=examples/demo/reward.py`
(`custom_reward_function.name` defaults to `compute_score`). The reward is dense - every right
character counts - so a randomly initialised model gets a learning signal from its first samples.
"""


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """Fraction of the response's non-space characters equal to `ground_truth` (a single digit)."""
    chars = [c for c in solution_str if not c.isspace()]
    if not chars:
        return 0.0
    return sum(c == ground_truth for c in chars) / len(chars)
