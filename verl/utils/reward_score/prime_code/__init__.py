"""Code reward: the completion's Python program run on the sample's stdin/stdout test cases in a child process
with time and memory limits (see `testing_util`). For hostile model output use a sandbox_fusion server instead."""
from __future__ import annotations

import json

from verl.utils.reward_score.prime_code.utils import check_correctness

__all__ = ["compute_score", "extract_code"]

_CONTINUOUS_CASES = 10


def extract_code(completion: str) -> str:
    """The last ```python fenced block of the completion (the whole text when there is none)."""
    if "```python" in completion:
        return completion.split("```python")[-1].split("```")[0]
    if completion.count("```") >= 2:
        return completion.split("```")[-2].split("\n", 1)[-1]
    return completion


def compute_score(completion: str, test_cases, continuous: bool = False, timeout: float = 5,
                  memory_mb: int = 1024):
    """(score, metadata): True/False when every case passes or not; with `continuous`, the fraction of the first
    ten cases passed. `test_cases` is a dict or its JSON text with "inputs" and "outputs"."""
    code = extract_code(str(completion))
    try:
        cases = test_cases if isinstance(test_cases, dict) else json.loads(test_cases)
        inputs, outputs = list(cases["inputs"]), list(cases["outputs"])
    except (ValueError, TypeError, KeyError) as exc:
        return False, [{"error": f"unreadable test cases: {exc}"}]
    if not continuous:
        results, metadata = check_correctness({"inputs": inputs, "outputs": outputs}, code, timeout=timeout,
                                              memory_mb=memory_mb)
        return all(r is True for r in results) and len(results) == len(inputs), metadata
    results, metadata = [], []
    for stdin, expected in list(zip(inputs, outputs))[:_CONTINUOUS_CASES]:
        res, meta = check_correctness({"inputs": [stdin], "outputs": [expected]}, code, timeout=timeout,
                                      memory_mb=memory_mb)
        results.extend(res)
        metadata.extend(meta)
    return sum(r is True for r in results) / max(len(results), 1), metadata
