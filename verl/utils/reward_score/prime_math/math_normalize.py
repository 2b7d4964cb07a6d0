"""Answer normalisation for the MATH-style string comparison (delegates to this verl's `math_reward`)."""
from __future__ import annotations

from typing import Optional

from verl.utils.reward_score.math_reward import strip_string

__all__ = ["normalize_answer"]


def normalize_answer(answer: Optional[str]) -> Optional[str]:
    """The canonical string `math_reward` compares (`\\text{...}` wrappers dropped); None stays None."""
    if answer is None:
        return None
    answer = answer.strip()
    if answer.startswith("\\text{") and answer.endswith("}"):
        answer = answer[len("\\text{"):-1]
    try:
        return strip_string(answer)
    except Exception:  # a malformed LaTeX fragment compares as written
        return answer
