"""PRIME's reward manager: every response scored in parallel worker processes with a per-sample time limit;
a sample whose scorer fails or runs out of time scores 0. The batch's accuracy is kept in `data.batch["acc"]`."""
from __future__ import annotations

import asyncio
from concurrent.futures import ProcessPoolExecutor
from functools import partial
from typing import Any, Callable, Optional

import torch

from verl.workers.reward_manager._common import ScoringManagerBase, decode_batch

__all__ = ["PrimeRewardManager", "run_reward_scoring", "parallel_compute_score_async", "single_compute_score"]

SAMPLE_TIMEOUT_S = 300.0


def _as_score(result) -> float:
    if result is None or isinstance(result, BaseException):
        return 0.0
    if isinstance(result, dict):
        return float(result.get("score", 0.0))
    if isinstance(result, (int, float, bool)):
        return float(result)
    return float(result[0])


async def single_compute_score(evaluation_func, completion, reference, task, task_extra_info, executor,
                               timeout: float = SAMPLE_TIMEOUT_S):
    """One score from a worker process; None when it fails or runs past `timeout`."""
    loop = asyncio.get_running_loop()
    call = partial(evaluation_func, task, completion, reference, task_extra_info)
    try:
        return await asyncio.wait_for(loop.run_in_executor(executor, call), timeout=timeout)
    except Exception as exc:  # a failing or slow scorer gives this sample 0, not the batch an error
        print(f"[reward] {type(exc).__name__} scoring a {task!r} sample: {str(exc)[:200]}")
        return None


async def parallel_compute_score_async(evaluation_func, completions, references, tasks, extra_info=None,
                                       num_processes: int = 64, timeout: float = SAMPLE_TIMEOUT_S) -> list[float]:
    """Scores of all samples from a pool of `num_processes` processes; failures and timeouts score 0.0."""
    extra_info = [None] * len(tasks) if extra_info is None else extra_info
    executor = ProcessPoolExecutor(max_workers=num_processes)
    try:
        results = await asyncio.gather(*[
            single_compute_score(evaluation_func, c, r, t, e, executor, timeout=timeout)
            for c, r, t, e in zip(completions, references, tasks, extra_info, strict=True)])
    finally:
        for proc in list(getattr(executor, "_processes", {}).values()):  # a hung scorer must not outlive the call
            proc.kill()
        executor.shutdown(wait=False, cancel_futures=True)
    return [_as_score(r) for r in results]


def run_reward_scoring(evaluation_func, completions, references, tasks, extra_info=None, num_processes: int = 64,
                       timeout: float = SAMPLE_TIMEOUT_S) -> list[float]:
    """`parallel_compute_score_async` run to completion on a fresh event loop."""
    return asyncio.run(parallel_compute_score_async(evaluation_func, completions, references, tasks, extra_info,
                                                    num_processes, timeout))


class PrimeRewardManager(ScoringManagerBase):
    """Outcome rewards on each response's last token, scored in parallel with per-sample time limits."""

    def __init__(self, tokenizer, num_examine: int, compute_score: Optional[Callable] = None,
                 reward_fn_key: str = "data_source", num_processes: int = 64,
                 timeout: float = SAMPLE_TIMEOUT_S) -> None:
        super().__init__(tokenizer, num_examine, compute_score, reward_fn_key)
        self.num_processes = num_processes
        self.timeout = timeout

    def verify(self, data) -> list[float]:
        """Score every response; the scores also go to `data.batch["acc"]`."""
        decoded = decode_batch(data, self.tokenizer, self.reward_fn_key)
        scores = run_reward_scoring(self.compute_score, decoded.responses, decoded.ground_truths,
                                    decoded.data_sources, decoded.extra_infos,
                                    num_processes=min(self.num_processes, max(1, len(decoded.responses))),
                                    timeout=self.timeout)
        data.batch["acc"] = torch.tensor(scores, dtype=torch.float32, device=data.batch["prompts"].device)
        return scores

    def __call__(self, data, return_dict: bool = False) -> torch.Tensor | dict[str, Any]:
        precomputed = self._extract_reward_from_rm_scores(data, return_dict)
        if precomputed is not None:
            return precomputed
        decoded = decode_batch(data, self.tokenizer, self.reward_fn_key)
        scores = self.verify(data)
        reward = torch.zeros_like(data.batch["responses"], dtype=torch.float32)
        shown: dict = {}
        for i, score in enumerate(scores):
            reward[i, max(decoded.response_lengths[i] - 1, 0)] = score
            source = decoded.data_sources[i]
            if shown.get(source, 0) < self.num_examine:
                shown[source] = shown.get(source, 0) + 1
                print("[response]", decoded.responses[i], "[score]", score)
        return {"reward_tensor": reward} if return_dict else reward
