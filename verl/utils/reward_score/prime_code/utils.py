"""`check_correctness`: upstream's entry point into the local test runner."""
from __future__ import annotations

from typing import Optional

from verl.utils.reward_score.prime_code.testing_util import run_test

__all__ = ["check_correctness"]


def check_correctness(in_outs: Optional[dict], generation: str, timeout: float = 10, debug: bool = True,
                      memory_mb: int = 1024):
    """Run `generation` on every case of `in_outs` ({"inputs": [...], "outputs": [...]}); (results, metadata)
    as `run_test` gives them, stopping at the first failing case."""
    if not in_outs:
        return [-1], [{"error": "no test cases"}]
    return run_test(in_outs, generation, timeout=timeout, memory_mb=memory_mb)
