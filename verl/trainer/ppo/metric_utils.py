"""Metrics the PPO trainer logs each step, under upstream verl's names.

Everything here is computed on the driver from the step's batch (a `DataProto`) and the section
timings, so dashboards and scripts written for upstream read the same keys.
"""
from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

import numpy as np
import torch


def reduce_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    """Mean of each metric's values (workers report one value per micro-batch and per rank)."""
    out = {}
    for key, values in metrics.items():
        if isinstance(values, torch.Tensor):
            values = values.detach().float().cpu().numpy()
        out[key] = float(np.mean(values))
    return out


def _compute_response_info(batch) -> dict[str, torch.Tensor]:
    """Real (unpadded) prompt and response lengths per sequence, as floats, and the response part of the
    attention mask (upstream's helper name: its tests patch it)."""
    response_width = batch.batch["responses"].shape[-1]
    attention_mask = batch.batch["attention_mask"]
    response_mask = attention_mask[:, -response_width:]
    return {
        "prompt_length": attention_mask[:, :-response_width].sum(-1).float(),
        "response_length": response_mask.sum(-1).float(),
        "response_mask": response_mask,
    }


def _lengths(batch) -> tuple[torch.Tensor, torch.Tensor]:
    info = _compute_response_info(batch)
    return info["prompt_length"], info["response_length"]


def _stats(prefix: str, values: torch.Tensor) -> dict[str, float]:
    values = values.detach().float()
    if values.numel() == 0:
        return {f"{prefix}/mean": float("nan"), f"{prefix}/max": float("nan"), f"{prefix}/min": float("nan")}
    return {
        f"{prefix}/mean": values.mean().item(),
        f"{prefix}/max": values.max().item(),
        f"{prefix}/min": values.min().item(),
    }


def compute_data_metrics(batch, use_critic: bool = True) -> dict[str, float]:
    """Scores, rewards, advantages, returns, values and lengths of one training batch."""
    response_mask = batch.batch["response_mask"].bool()
    prompt_length, response_length = _lengths(batch)
    max_prompt_length = batch.batch["prompts"].shape[-1]
    max_response_length = batch.batch["responses"].shape[-1]

    metrics = {}
    metrics.update(_stats("critic/score", batch.batch["token_level_scores"].sum(-1)))
    metrics.update(_stats("critic/rewards", batch.batch["token_level_rewards"].sum(-1)))
    metrics.update(_stats("critic/advantages", torch.masked_select(batch.batch["advantages"], response_mask)))
    valid_returns = torch.masked_select(batch.batch["returns"], response_mask)
    metrics.update(_stats("critic/returns", valid_returns))

    if use_critic:
        valid_values = torch.masked_select(batch.batch["values"], response_mask)
        metrics.update(_stats("critic/values", valid_values))
        # Fraction of the returns' variance the value function explains (1 = perfect, <= 0 = useless).
        explained = 1.0 - torch.var(valid_returns - valid_values) / (torch.var(valid_returns) + 1e-5)
        metrics["critic/vf_explained_var"] = explained.item()

    metrics.update(_stats("response_length", response_length))
    metrics["response_length/clip_ratio"] = (response_length == max_response_length).float().mean().item()
    metrics.update(_stats("prompt_length", prompt_length))
    metrics["prompt_length/clip_ratio"] = (prompt_length == max_prompt_length).float().mean().item()
    if "__num_turns__" in batch.non_tensor_batch:   # multi-turn rollouts: prompt + assistant + tool turns
        turns = np.asarray(batch.non_tensor_batch["__num_turns__"], dtype=np.float64)
        metrics.update({"num_turns/min": turns.min(), "num_turns/max": turns.max(), "num_turns/mean": turns.mean()})
    return metrics


# Sections whose time is divided by a token count for timing_per_token_ms: generation by the tokens
# it produced, the passes over whole sequences by prompt + response tokens.
_PER_TOKEN_SECTIONS = ("gen", "ref", "values", "adv", "update_critic", "update_actor")


def compute_timing_metrics(batch, timing_raw: dict[str, float]) -> dict[str, float]:
    prompt_length, response_length = _lengths(batch)
    n_response = response_length.sum().item()
    n_total = prompt_length.sum().item() + n_response

    metrics = {f"timing_s/{name}": seconds for name, seconds in timing_raw.items()}
    for name in _PER_TOKEN_SECTIONS:
        if name in timing_raw:
            n_tokens = n_response if name == "gen" else n_total
            metrics[f"timing_per_token_ms/{name}"] = timing_raw[name] * 1000 / n_tokens if n_tokens > 0 else 0.0
    return metrics


def compute_throughout_metrics(batch, timing_raw: dict[str, float], n_gpus: int) -> dict[str, float]:
    """Tokens per second per device over the whole step (upstream's spelling of the name)."""
    # the per-sequence counts the trainer records for balancing, else the attention mask's
    if "global_token_num" in batch.meta_info:
        total_tokens = int(sum(batch.meta_info["global_token_num"]))
    else:
        total_tokens = int(batch.batch["attention_mask"].sum().item())
    step_time = timing_raw["step"]
    return {
        "perf/total_num_tokens": total_tokens,
        "perf/time_per_step": step_time,
        "perf/throughput": total_tokens / (step_time * n_gpus),
    }


def _bootstrap(values: list, subset_size: int, reduce_fns: list, n_bootstrap: int, seed: int):
    """(mean, std) of each reduce_fn over `n_bootstrap` resamples of `subset_size` items."""
    rng = np.random.RandomState(seed)
    data = np.array(values, dtype=object)
    idx = rng.choice(len(data), size=(n_bootstrap, subset_size), replace=True)
    out = []
    for fn in reduce_fns:
        results = np.array([fn(data[row]) for row in idx], dtype=np.float64)
        out.append((float(results.mean()), float(results.std())))
    return out


def _majority_value(pairs) -> float:
    """Value of the first answer among the most frequent predicted answers."""
    counts = Counter(pred for pred, _ in pairs)
    winner = max(counts, key=counts.get)
    return next(val for pred, val in pairs if pred == winner)


def _subset_sizes(n: int) -> list[int]:
    """2, 4, 8, ... below n, then n itself (upstream's best@k / maj@k grid)."""
    sizes, k = [], 2
    while k < n:
        sizes.append(k)
        k *= 2
    return sizes + [n] if n > 1 else []


def process_validation_metrics(
    data_sources: list[str],
    sample_uids: list[str],
    infos_dict: dict[str, list[Any]],
    seed: int = 42,
    expected_acc_counts: dict[tuple[str, str], int] | None = None,
    n_bootstrap: int = 1000,
) -> dict[str, dict[str, dict[str, float]]]:
    """Per data source and variable: mean@n, std@n, best@k, worst@k (and maj@k with a `pred` key).

    Samples are grouped by prompt (uid); statistics are taken over the n responses of each prompt and
    then averaged over prompts. Returns {data_source: {variable: {metric: value}}}.

    `expected_acc_counts` ({(data_source, uid): n}) is for rollouts that may drop sessions: in a source that
    reports `acc`, each prompt's missing sessions count as acc 0, and `acc_success_only` keeps the mean over
    the sessions that came back. Sources without `acc` are left as they are.
    """
    grouped = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for i, (source, uid) in enumerate(zip(data_sources, sample_uids)):
        for var, values in infos_dict.items():
            grouped[source][uid][var].append(values[i])
    if expected_acc_counts:
        with_acc = {source for source, by_uid in grouped.items()
                    if any(v is not None for by_var in by_uid.values() for v in by_var.get("acc", ()))}
        for (source, uid), expected in expected_acc_counts.items():
            if source in with_acc:
                by_var = grouped[source][uid]
                seen = [v for v in by_var.get("acc", ()) if v is not None]
                by_var["acc_success_only"] = seen
                by_var["acc"] = seen + [0.0] * max(expected - len(seen), 0)

    per_prompt = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for source, by_uid in grouped.items():
        for uid, by_var in by_uid.items():
            preds = by_var.get("pred")
            for var, values in by_var.items():
                values = [v for v in values if v is not None]
                if not values or isinstance(values[0], str):
                    continue
                n = len(values)
                stats = {f"mean@{n}": float(np.mean(values))}
                if n > 1:
                    stats[f"std@{n}"] = float(np.std(values))
                    for k in _subset_sizes(n):
                        (best, best_std), (worst, worst_std) = _bootstrap(values, k, [np.max, np.min], n_bootstrap, seed)
                        stats.update({f"best@{k}/mean": best, f"best@{k}/std": best_std,
                                      f"worst@{k}/mean": worst, f"worst@{k}/std": worst_std})
                        if preds is not None and len(preds) == n:
                            [(maj, maj_std)] = _bootstrap(list(zip(preds, values)), k, [_majority_value], n_bootstrap, seed)
                            stats.update({f"maj@{k}/mean": maj, f"maj@{k}/std": maj_std})
                for metric, value in stats.items():
                    per_prompt[source][var][metric].append(value)

    return {
        source: {var: {metric: float(np.mean(vals)) for metric, vals in metrics.items()} for var, metrics in by_var.items()}
        for source, by_var in per_prompt.items()
    }


def bootstrap_metric(data: list[Any], subset_size: int, reduce_fns: list, n_bootstrap: int = 1000,
                     seed: int = 42) -> list[tuple[float, float]]:
    """(mean, std) of each reduce_fn over `n_bootstrap` random subsets (drawn with replacement) of `data`."""
    return _bootstrap(data, subset_size, reduce_fns, n_bootstrap, seed)


def calc_maj_val(data: list[dict[str, Any]], vote_key: str, val_key: str) -> float:
    """`val_key` of the first item whose `vote_key` is the most frequent vote."""
    return _majority_value([(item[vote_key], item[val_key]) for item in data])
