"""Math scoring with the `math-verify` package (optional: `pip install math-verify`; it pins an antlr4 release
that hydra's parser cannot load, so it is not part of this verl's extras)."""
from __future__ import annotations

from verl.utils.py_functional import timeout_limit

__all__ = ["compute_score"]


def _verify(ground_truth_boxed: str, model_output: str) -> float:
    try:
        from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
    except ImportError as exc:
        raise ImportError("verl.utils.reward_score.math_verify needs the math-verify package: pip install "
                          "math-verify") from exc
    gold = parse(ground_truth_boxed, extraction_config=[LatexExtractionConfig()])
    answer = parse(model_output, extraction_config=[ExprExtractionConfig(), LatexExtractionConfig()])
    return 1.0 if gold and answer and verify(gold, answer) else 0.0


def compute_score(model_output: str, ground_truth: str, timeout_score: float = 0, timeout: float = 30.0) -> float:
    """1.0 when math-verify finds the response's answer equal to `\\boxed{ground_truth}`, else 0.0;
    `timeout_score` when the check runs past `timeout` seconds (it runs in a child process)."""
    try:
        return timeout_limit(timeout)(_verify)(f"\\boxed{{{ground_truth}}}", str(model_output))
    except TimeoutError:
        return timeout_score
