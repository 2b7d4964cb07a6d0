"""PRIME's math grader (the `numina_*` data sources): the answer is found in the response (an "answer is" phrase
or the last `\\boxed{}`), then compared with the ground truth as normalised strings, as numbers, and
symbolically under a time limit."""
from __future__ import annotations

from verl.utils.reward_score._boxed import last_braced_command, unwrap
from verl.utils.reward_score.prime_math import math_normalize
from verl.utils.reward_score.prime_math.grader import math_equal

__all__ = ["compute_score", "match_answer", "grade_answer"]

_AFTER = ("answer:", "answer is", "answers are")
_BEFORE = ("is answer", "is the answer", "are answers", "are the answers")
_TAIL = ("be ", "is ", "are ", "=", ": ", "get ", "be\n", "is\n", "are\n", ":\n", "get\n")


def match_answer(response: str) -> tuple[bool, str]:
    """(found, answer): the text after the last answer phrase, or the last boxed expression, trimmed to what
    follows a final 'is' / '=' ...; `found` is False when the answer has no digit."""
    found = False
    lower = response.lower()
    for marker in _AFTER:
        at = lower.rfind(marker)
        if at != -1:
            found, response = True, response[at + len(marker):].strip()
            lower = response.lower()
    for marker in _BEFORE:
        at = lower.rfind(marker)
        if at != -1:
            found, response = True, response[:at].strip()
            lower = response.lower()
    boxed = last_braced_command(response, "\\boxed") or last_braced_command(response, "\\fbox")
    if boxed:
        found, response = True, unwrap(boxed, "\\boxed{" if boxed.startswith("\\boxed") else "\\fbox{")
    if ". " in response:
        response = response[:response.rfind(". ")].strip()
    for marker in _TAIL:
        at = response.lower().rfind(marker)
        if at != -1:
            found, response = True, response[at + len(marker):].strip()
    return found and any(c.isdigit() for c in response), response


def grade_answer(given_answer: str, ground_truth: str) -> bool:
    """Normalised strings equal, or `math_equal` (numbers, tuples, sympy under a time limit)."""
    if given_answer is None:
        return False
    if math_normalize.normalize_answer(given_answer) == math_normalize.normalize_answer(ground_truth):
        return True
    return math_equal(given_answer, ground_truth, timeout=True)


def compute_score(model_output: str, ground_truth: str) -> tuple[bool, bool, str]:
    """(correct, well formatted, extracted answer); well formatted means the PRIME prompt's 'Step 2:' and a box."""
    model_output, ground_truth = str(model_output), str(ground_truth)
    _, answer = match_answer(model_output)
    formatted = "Step 2:" in model_output and "\\box" in model_output
    try:
        correct = grade_answer(answer, ground_truth)
    except Exception:
        correct = False
    return correct, formatted, answer
