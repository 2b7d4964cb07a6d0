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
# upstream scores these with scorers this build leaves out (see docs/upstream/compatibility.md)
_LEFT_OUT = {
    **dict.fromkeys(("numina_aops_forum", "numina_synthetic_math", "numina_amc_aime", "numina_synthetic_amc",
                     "numina_cn_k12", "numina_olympiads"),
                    "upstream's prime_math grader (sympy with per-answer subprocess timeouts) is not built in"),
    **dict.fromkeys(("codecontests", "apps", "codeforces", "taco"),
                    "code rewards run untrusted code (prime_code / a sandbox_fusion server) and are not built in"),
}


def _scorer_for(data_source: str):
    name = _SCORERS.get(data_source) or ("math_dapo" if str(data_source).startswith("aime") else None)
    if name is None:
        return None
    from importlib import import_module

    return import_module(f"{__name__}.{name}").compute_score


def default_compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """Score one response with the rule for its data source.

    Returns a float, or the scorer's dict unchanged (a dict carries "score" plus extra metrics).
    `extra_info` and extra keyword arguments (upstream passes sandbox settings) are accepted so the call
    signature matches upstream's; the built-in rules do not use them.
    """
    scorer = _scorer_for(data_source)
    if scorer is None:
        why = f" ({_LEFT_OUT[data_source]})" if data_source in _LEFT_OUT else ""
        raise NotImplementedError(
            f"No built-in reward for data_source={data_source!r}{why}; built in: {sorted(_SCORERS)} and aime*. "
            "Write a reward function and point custom_reward_function.path (and .name, default "
            "'compute_score') at it, or fix the data_source column of your data."
        )
    result = scorer(solution_str, ground_truth)
    if isinstance(result, dict):
        return result
    return float(result[0]) if isinstance(result, (list, tuple)) else float(result)


def _default_compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """Old name kept for scripts written against earlier verl releases."""
    warnings.warn(
        "verl.utils.reward_score._default_compute_score is deprecated; use default_compute_score",
        DeprecationWarning,
        stacklevel=2,
    )
    return default_compute_score(data_source, solution_str, ground_truth, extra_info, **kwargs)


__all__ = ["default_compute_score"]
