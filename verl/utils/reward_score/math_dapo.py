"""DAPO-style math answers (upstream's `math_dapo`, `math`, `math_dapo_reasoning` and `aime*` sources).

The response's last 300 characters are searched for `Answer: ...` (Minerva style); the answer and the
ground truth are normalised (units, `\\text{}`, `$`, `\\boxed{}`, thousands separators...) and compared
as strings. Without an `Answer:` line, the last `\\boxed{}` in the final 100 characters must equal the
ground truth exactly. Result: {"score": 1.0 or -1.0, "acc": bool, "pred": the extracted answer}.
"""
from __future__ import annotations

import re

from verl.utils.reward_score._boxed import last_braced_command, unwrap

__all__ = ["compute_score", "is_correct_minerva", "is_correct_strict_box", "last_boxed_only_string",
           "normalize_final_answer", "remove_boxed", "verify"]

INVALID = "[INVALID]"

# Minerva's normalisation tables (Lewkowycz et al. 2022, appendix D), applied in order.
SUBSTITUTIONS = [("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), (r"\ ", ""), (" ", ""), ("mbox", "text"),
                 (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}")]
REMOVED_EXPRESSIONS = ["square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots",
                       "sue", "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds",
                       "meters", "meals", "edges", "students", "childrentickets", "multiples", "\\text{s}",
                       "\\text{.}", "\\text{\ns}", "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}",
                       r"\mathrm{th}", r"^\circ", r"^{\circ}", r"\;", r",\!", "{,}", '"', "\\dots"]

# (pattern, replacement) rewrites after the tables: keep the inside of $...$, \text{}, \textbf{},
# \overline{}, \boxed{}; brace one-character \frac and \sqrt arguments.
_REGEX_REWRITES = [(re.compile(r"(.*?)(\$)(.*?)(\$)(.*)"), "$\\3$"), (re.compile(r"(\\text\{)(.*?)(\})"), "\\2"),
                   (re.compile(r"(\\textbf\{)(.*?)(\})"), "\\2"), (re.compile(r"(\\overline\{)(.*?)(\})"), "\\2"),
                   (re.compile(r"(\\boxed\{)(.*)(\})"), "\\2"), (re.compile(r"(frac)([^{])(.)"), "frac{\\2}{\\3}"),
                   (re.compile(r"(sqrt)([^{])"), "sqrt{\\2}")]


def last_boxed_only_string(string: str) -> str | None:
    return last_braced_command(string, "\\boxed{")


def remove_boxed(s: str) -> str:
    return unwrap(s)


def normalize_final_answer(final_answer: str) -> str:
    """Minerva's answer normalisation: the text after the last `=`, tables, rewrites, no `$`."""
    answer = final_answer.split("=")[-1]
    for old, new in SUBSTITUTIONS:
        answer = answer.replace(old, new)
    for expression in REMOVED_EXPRESSIONS:
        answer = answer.replace(expression, "")
    for pattern, replacement in _REGEX_REWRITES:
        answer = pattern.sub(replacement, answer)
    answer = answer.replace("$", "")
    if answer.replace(",", "").isdigit():
        answer = answer.replace(",", "")
    return answer.strip()


def is_correct_minerva(solution_str: str, gt: str, gt_need_extract: bool = False,
                       answer_pattern: str = r"(?i)Answer\s*:\s*([^\n]+)") -> tuple[bool, str]:
    """(normalised last `Answer:` == normalised ground truth, the normalised prediction)."""
    found = re.findall(answer_pattern, solution_str)
    pred = normalize_final_answer(found[-1] if found else INVALID)
    truth = normalize_final_answer(remove_boxed(last_boxed_only_string(gt)) if gt_need_extract else gt)
    return pred == truth, pred


def is_correct_strict_box(pred: str, gt: str, pause_tokens_index: list[int] | None = None) -> tuple[int, str | None]:
    """(1 if the last `\\boxed{}` of the final 100 characters equals `gt` exactly else -1, its content)."""
    if pause_tokens_index is not None:
        if len(pause_tokens_index) != 4:
            raise ValueError("pause_tokens_index must hold 4 indices")
        tail = pred[pause_tokens_index[-1] - 100 :]
    else:
        tail = pred[-100:]
    boxed = last_boxed_only_string(tail)
    content = remove_boxed(boxed) if boxed is not None else None
    return (1 if content == gt else -1), content


def verify(solution_str: str, answer: str, strict_box_verify: bool = False,
           pause_tokens_index: list[int] | None = None) -> tuple[bool, str | None]:
    if strict_box_verify:
        score, pred = is_correct_strict_box(solution_str, answer, pause_tokens_index)
        return score == 1, pred
    correct, pred = is_correct_minerva(solution_str, answer)
    if pred != INVALID:
        return correct, pred
    score, boxed_pred = is_correct_strict_box(solution_str, answer, pause_tokens_index)
    if boxed_pred is not None:
        return score == 1, boxed_pred
    return correct, pred


def compute_score(solution_str: str, ground_truth: str, strict_box_verify: bool = False,
                  pause_tokens_index: list[int] | None = None) -> dict:
    correct, pred = verify(solution_str[-300:], ground_truth, strict_box_verify, pause_tokens_index)
    return {"score": 1.0 if correct else -1.0, "acc": correct, "pred": pred}
