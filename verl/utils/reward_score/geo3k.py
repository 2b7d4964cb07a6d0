"""Geometry3K (`hiyouga/geometry3k`): 0.9 x answer correctness + 0.1 x format, as upstream.

Correctness grades the last `\\boxed{}` against the ground truth with `mathruler`'s grader (what
upstream uses; install `pip install verl[reward]`); the format term is 1 when the response is
`<think>...</think>` followed by a `\\boxed{...}` answer.
"""
from __future__ import annotations

import re

__all__ = ["acc_reward", "compute_score", "format_reward"]

_FORMAT = re.compile(r"<think>.*</think>.*\\boxed\{.*\}.*", re.DOTALL)


def _grader():
    try:
        from mathruler.grader import extract_boxed_content, grade_answer
    except ImportError as err:
        raise ImportError("the geo3k reward grades answers with mathruler: pip install 'verl[reward]' "
                          "(mathruler and pylatexenc)") from err
    return extract_boxed_content, grade_answer


def format_reward(predict_str: str) -> float:
    return 1.0 if _FORMAT.fullmatch(predict_str) else 0.0


def acc_reward(predict_str: str, ground_truth: str, use_boxed: bool = True) -> float:
    extract, grade = _grader()
    answer = extract(predict_str) if use_boxed else predict_str
    return 1.0 if grade(answer, ground_truth) else 0.0


def compute_score(predict_str: str, ground_truth: str, use_boxed: bool = True, format_score: float = 0.1) -> float:
    return ((1.0 - format_score) * acc_reward(predict_str, ground_truth, use_boxed)
            + format_score * format_reward(predict_str))
