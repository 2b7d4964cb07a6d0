"""Rule-based GSM8K reward: find the model's final number and compare it, as a string, to the label.

Scoring follows upstream verl so that reward curves are comparable: the label is the text after `####`
with commas removed, and a correct answer must match it character for character ("72" != "72.0").
"""

from __future__ import annotations

import re

# Only the tail of a response is searched. The final answer sits at the end, and running the regexes over
# a long degenerate rollout would cost time for nothing. Same window as upstream, so scores agree.
CLIP_CHARS = 300

_STRICT = re.compile(r"#### (-?[0-9.,]+)")
_NUMBER = re.compile(r"(-?[0-9.,]+)")


def extract_solution(solution_str: str, method: str = "strict") -> str | None:
    """The answer the response commits to, or None.

    strict: the last "#### <number>" (this also rewards the output format), commas and "$" stripped.
    flexible: the last run of digits/dots/commas anywhere in the tail that is not just "." (kept verbatim).
    """
    if method not in ("strict", "flexible"):
        raise ValueError(f"method must be 'strict' or 'flexible', got {method!r}")
    tail = solution_str[-CLIP_CHARS:]

    if method == "strict":
        found = _STRICT.findall(tail)
        if not found:
            return None
        return found[-1].replace(",", "").replace("$", "")

    found = _NUMBER.findall(tail)
    if not found:
        return None
    meaningful = [s for s in found if s not in ("", ".")]
    # Upstream falls back to the first match when every match is a bare "."; keep that so scores agree.
    return meaningful[-1] if meaningful else found[0]


def compute_score(
    solution_str: str, ground_truth: str, method: str = "strict", format_score: float = 0.0, score: float = 1.0
) -> float:
    """`score` for the right answer, `format_score` for a wrong but extractable one, 0 when none is found."""
    answer = extract_solution(solution_str, method=method)
    if answer is None:
        return 0
    return score if answer == ground_truth else format_score
