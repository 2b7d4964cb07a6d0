"""Search-R1 style QA (`searchR1_nq`, `_triviaqa`, `_popqa`, `_hotpotqa`, `_2wikimultihopqa`, `_musique`,
`_bamboogle`): the last `<answer>...</answer>` against `ground_truth["target"]` (one string or several)
by exact match after SQuAD-style normalisation (lower case, no punctuation, no articles, single spaces).
A correct answer scores `score`, divided by 4 when the response holds more than 10 `<answer>` or
`</answer>` tags; a wrong one `format_score`; no answer 0.
"""
from __future__ import annotations

import re
import string

__all__ = ["compute_score", "compute_score_subem", "em_check", "extract_solution", "normalize_answer",
           "subem_check"]

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_PUNCTUATION = str.maketrans("", "", string.punctuation)
MAX_ANSWER_TAGS = 10


def normalize_answer(s: str) -> str:
    return " ".join(_ARTICLES.sub(" ", s.lower().translate(_PUNCTUATION)).split())


def _targets(golden_answers) -> list[str]:
    return [golden_answers] if isinstance(golden_answers, str) else list(golden_answers)


def em_check(prediction: str, golden_answers) -> int:
    pred = normalize_answer(prediction)
    return int(any(normalize_answer(g) == pred for g in _targets(golden_answers)))


def subem_check(prediction: str, golden_answers) -> int:
    pred = normalize_answer(prediction)
    return int(any(normalize_answer(g) in pred for g in _targets(golden_answers)))


def extract_solution(solution_str: str) -> str | None:
    found = _ANSWER.findall(solution_str)
    return found[-1].strip() if found else None


def count_answer_tags(text: str) -> tuple[int, int]:
    return text.count("<answer>"), text.count("</answer>")


def compute_score(solution_str: str, ground_truth: dict, method: str = "strict", format_score: float = 0.0,
                  score: float = 1.0) -> float:
    answer = extract_solution(solution_str)
    if answer is None:
        return 0
    if not em_check(answer, ground_truth["target"]):
        return format_score
    opened, closed = count_answer_tags(solution_str)
    return score / 4 if opened > MAX_ANSWER_TAGS or closed > MAX_ANSWER_TAGS else score


def compute_score_subem(solution_str: str, ground_truth: dict, method: str = "strict", format_score: float = 0.0,
                        score: float = 1.0) -> float:
    answer = extract_solution(solution_str)
    if answer is None:
        return 0
    return score if subem_check(answer, ground_truth["target"]) else format_score
