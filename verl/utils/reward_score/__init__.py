"""Built-in rule rewards, chosen by a sample's `data_source` (the dataset's `data_source` column)."""

from __future__ import annotations

import warnings

from . import gsm8k

# data_source -> scorer module (imported on first use), as upstream dispatches. Everything else needs a
# user reward function.
_MATH_SOURCES = ("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500")
_DAPO_SOURCES = ("math_dapo", "math", "math_dapo_reasoning")
_SEARCH_R1_SOURCES = tuple(f"searchR1_{name}" for name in ("nq", "triviaqa", "popqa", "hotpotqa", "2wikimultihopqa",
                                                           "musique", "bamboogle"))
_SCORERS = {
    "openai/gsm8k": "gsm8k",
    "hiyouga/geometry3k": "geo3k",
    **dict.fromkeys(_MATH_SOURCES, "math_reward"),
    **dict.fromkeys(_DAPO_SOURCES, "math_dapo"),
    **dict.fromkeys(_SEARCH_R1_SOURCES, "search_r1_like_qa_em"),
}
_SCORERS.update(dict.fromkeys(("numina_aops_forum", "numina_synthetic_math", "numina_amc_aime",
                               "numina_synthetic_amc", "numina_cn_k12", "numina_olympiads"), "prime_math"))
# code: run on a sandbox_fusion server when its URL is given, else locally under time and memory limits
_CODE_SOURCES = ("codecontests", "apps", "codeforces", "taco")


def _scorer_for(data_source: str):
    name = _SCORERS.get(data_source) or ("math_dapo" if str(data_source).startswith("aime") else None)
    if name is None:
        return None
    from importlib import import_module

    return import_module(f"{__name__}.{name}").compute_score


def default_compute_score(data_source, solution_str, ground_truth, extra_info=None, sandbox_fusion_url=None,
                          concurrent_semaphore=None, memory_limit_mb=None, **kwargs):
    """Score one response with the rule for its data source.

    Returns a float, or the scorer's dict unchanged (a dict carries "score" plus extra metrics). Code sources
    (codecontests, apps, codeforces, taco) run on the sandbox_fusion server at `sandbox_fusion_url` when given,
    else in a local child process with time and memory limits (`prime_code`).
    """
    if data_source in _CODE_SOURCES:
        if sandbox_fusion_url:
            from . import sandbox_fusion

            result = sandbox_fusion.compute_score(sandbox_fusion_url, concurrent_semaphore, memory_limit_mb or 1024,
                                                  solution_str, ground_truth, continuous=True)
        else:
            from . import prime_code

            result = prime_code.compute_score(solution_str, ground_truth, continuous=True,
                                              memory_mb=memory_limit_mb or 1024)
        return float(result[0])
    scorer = _scorer_for(data_source)
    if scorer is None:
        raise NotImplementedError(
            f"No built-in reward for data_source={data_source!r}; built in: "
            f"{sorted(_SCORERS) + list(_CODE_SOURCES)} and aime*. "
            "Write a reward function and point custom_reward_function.path (and .name, default "
            "'compute_score') at it, or fix the data_source column of your data."
        )
    result = scorer(solution_str, ground_truth)
    if isinstance(result, dict):
        return result
    return float(result[0]) if isinstance(result, (list, tuple)) else float(result)


def get_default_compute_score(reward_name: str | None = None):
    """The scorer a reward manager uses when the config names no custom function (the same for every manager)."""
    return default_compute_score


def _default_compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """Old name kept for scripts written against earlier verl releases."""
    warnings.warn(
        "verl.utils.reward_score._default_compute_score is deprecated; use default_compute_score",
        DeprecationWarning,
        stacklevel=2,
    )
    return default_compute_score(data_source, solution_str, ground_truth, extra_info, **kwargs)


__all__ = ["default_compute_score", "get_default_compute_score"]
