"""Code reward through a sandbox-fusion server: the completion's program run remotely on each test case."""
from __future__ import annotations

import json

from verl.utils.reward_score.prime_code import extract_code
from verl.utils.reward_score.sandbox_fusion.utils import check_correctness

__all__ = ["compute_score"]


def compute_score(sandbox_fusion_url, concurrent_semaphore, memory_limit_mb, completion, test_cases,
                  continuous=False, timeout=10):
    """(score, metadata): the fraction of cases passed (of the first ten with `continuous`), or 0.0 with an
    error entry when the test cases cannot be read."""
    try:
        cases = test_cases if isinstance(test_cases, dict) else json.loads(test_cases)
        inputs, outputs = list(cases["inputs"]), list(cases["outputs"])
    except (ValueError, TypeError, KeyError) as exc:
        return 0.0, [{"error": f"unreadable test cases: {exc}"}]
    if continuous:
        inputs, outputs = inputs[:10], outputs[:10]
    results, metadata = check_correctness(sandbox_fusion_url, {"inputs": inputs, "outputs": outputs},
                                          extract_code(str(completion)), timeout=timeout,
                                          memory_limit_mb=memory_limit_mb, concurrent_semaphore=concurrent_semaphore)
    return sum(r is True for r in results) / max(len(inputs), 1), metadata
