"""Finding the last `\\boxed{...}` in a response: shared by the MATH-family scorers."""
from __future__ import annotations


def closing_brace(text: str, start: int) -> int | None:
    """Index of the brace that closes the first `{` at or after `start`, or None if it never closes."""
    depth = 0
    for pos in range(start, len(text)):
        if text[pos] == "{":
            depth += 1
        elif text[pos] == "}":
            depth -= 1
            if depth == 0:
                return pos
    return None


def last_braced_command(text: str, command: str) -> str | None:
    """`command{...}` for the last occurrence of `command` in `text`, braces balanced; None if absent/open."""
    start = text.rfind(command)
    if start < 0:
        return None
    end = closing_brace(text, start)
    return None if end is None else text[start : end + 1]


def unwrap(boxed: str, opener: str = "\\boxed{") -> str:
    """The inside of `\\boxed{...}`; a ValueError for anything else (callers score that as wrong)."""
    if not (boxed.startswith(opener) and boxed.endswith("}")):
        raise ValueError(f"not a boxed answer: {boxed!r}")
    return boxed[len(opener) : -1]
