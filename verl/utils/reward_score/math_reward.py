"""MATH (Hendrycks et al.) answers: the last `\\boxed{}` of the response against the ground truth,
after the string normalisation of lm-evaluation-harness's hendrycks_math task (upstream verl scores
`lighteval/MATH`, `DigitalLearningGmbH/MATH-lighteval` and `HuggingFaceH4/MATH-500` this way).
Scores: 1.0 when equivalent, else 0.0.
"""
from __future__ import annotations

import re

from verl.utils.reward_score._boxed import closing_brace, unwrap

__all__ = ["compute_score", "is_equiv", "last_boxed_only_string", "remove_boxed", "strip_string"]


def compute_score(solution_str: str, ground_truth: str) -> float:
    try:
        boxed = last_boxed_only_string(solution_str)
        return 1.0 if boxed is not None and is_equiv(remove_boxed(boxed), ground_truth) else 0.0
    except Exception:   # noqa: BLE001 - a malformed answer is a wrong answer
        return 0.0


def last_boxed_only_string(string: str) -> str | None:
    """The last `\\boxed{...}` (or `\\fbox{...}`); `\\boxed x` (space form) runs to the next `$`."""
    if "\\boxed " in string:
        return "\\boxed " + string.split("\\boxed ")[-1].split("$")[0]
    start = string.rfind("\\boxed")
    if start < 0:
        start = string.rfind("\\fbox")
        if start < 0:
            return None
    end = closing_brace(string, start)
    return None if end is None else string[start : end + 1]


def remove_boxed(s: str) -> str:
    if s.startswith("\\boxed "):
        return s[len("\\boxed ") :]
    return unwrap(s)


def is_equiv(str1: str | None, str2: str | None, verbose: bool = False) -> bool:
    """Equal after `strip_string` (or, if normalising fails, equal as given)."""
    if str1 is None or str2 is None:
        return str1 is None and str2 is None
    try:
        a, b = strip_string(str1), strip_string(str2)
    except Exception:   # noqa: BLE001 - the normaliser rejects some inputs; compare them raw
        return str1 == str2
    if verbose:
        print(a, b)
    return a == b


# literal rewrites applied in this order before the structural fixes
_REMOVE_FIRST = ("\n", "\\!")
_REWRITES = (("\\\\", "\\"), ("tfrac", "frac"), ("dfrac", "frac"), ("\\left", ""), ("\\right", ""),
             ("^{\\circ}", ""), ("^\\circ", ""), ("\\$", ""))


def _drop_trailing_units(s: str) -> str:
    """`5 \\text{ cm}` -> `5 `; more than one `\\text{ ` is an error (the caller falls back to raw)."""
    if "\\text{ " not in s:
        return s
    head, *rest = s.split("\\text{ ")
    if len(rest) != 1:
        raise ValueError("more than one unit")
    return head


def _brace_sqrt(s: str) -> str:
    """`\\sqrt2` -> `\\sqrt{2}` (one character)."""
    head, *parts = s.split("\\sqrt")
    out = head
    for part in parts:
        out += "\\sqrt" + (part if part[0] == "{" else "{" + part[0] + "}" + part[1:])
    return out


def _brace_fracs(s: str) -> str:
    """`\\frac12` -> `\\frac{1}{2}`, `\\frac1{2}` -> `\\frac{1}{2}`; too short to fix: unchanged."""
    head, *parts = s.split("\\frac")
    out = head
    for part in parts:
        out += "\\frac"
        if part[0] == "{":
            out += part
            continue
        if len(part) < 2:
            return s
        num, second, tail = part[0], part[1], part[2:]
        out += "{" + num + "}" + ("{" + second + "}" if second != "{" else second) + tail
    return out


def _slash_to_frac(s: str) -> str:
    """`3/4` (two plain integers) -> `\\frac{3}{4}`."""
    parts = s.split("/")
    if len(parts) == 2 and all(re.fullmatch(r"-?\d+", p) for p in parts) and s == f"{int(parts[0])}/{int(parts[1])}":
        return "\\frac{" + str(int(parts[0])) + "}{" + str(int(parts[1])) + "}"
    return s


def strip_string(string: str) -> str:
    """lm-evaluation-harness's MATH answer normalisation."""
    s = string
    for token in _REMOVE_FIRST:
        s = s.replace(token, "")
    for old, new in _REWRITES:
        s = s.replace(old, new)
    s = _drop_trailing_units(s)
    s = s.replace("\\\\%", "").replace("\\%", "")
    s = s.replace(" .", " 0.").replace("{.", "{0.")
    if not s:
        return s
    if s[0] == ".":
        s = "0" + s
    sides = s.split("=")
    if len(sides) == 2 and len(sides[0]) <= 2:   # "x = 5" -> "5"
        s = sides[1]
    s = _brace_sqrt(s)
    s = s.replace(" ", "")
    s = _brace_fracs(s)
    if s == "0.5":
        s = "\\frac{1}{2}"
    return _slash_to_frac(s)
