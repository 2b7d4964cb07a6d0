"""Metrics the PPO trainer logs each step, under upstream verl's names.

Everything here is computed on the driver from the step's batch (a `DataProto`) and the section
timings, so dashboards and scripts written for upstream read the same keys.
"""
from __future__ import annotations

import logging
from collections import Counter, defaultdict
from typing import Any, Callable

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf
from transformers import AutoConfig

from verl.utils.fs import copy_to_local
from verl.utils.model import update_model_config

logger = logging.getLogger(__name__)


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


# ---- rollout MoE load balance ------------------------------------------------------------------------------
# For custom rollouts that record, per response token, the experts each MoE layer routed it to (upstream's
# `routed_experts`, shape (batch, seq, layers, top_k)). This verl's own rollout engines do not record them, so
# without such a column the metrics below are empty.

# model types whose `num_local_experts` is the global expert count (elsewhere it can be a per-rank figure)
_LOCAL_EXPERTS_ARE_GLOBAL = {"gpt_oss", "mixtral"}


def _field(obj: Any, name: str, default: Any = None) -> Any:
    """`name` of a dict-like or attribute-bearing config."""
    return obj.get(name, default) if hasattr(obj, "get") else getattr(obj, name, default)


def get_hf_config_override_kwargs(override_config: Any) -> dict[str, Any]:
    """The Hugging Face config overrides of `model.override_config` (its `model_config` part when nested)."""
    if isinstance(override_config, DictConfig):
        override_config = OmegaConf.to_container(override_config, resolve=True)
    if not override_config:
        return {}
    return override_config["model_config"] if "model_config" in override_config else override_config


def infer_moe_num_experts(model_config: Any) -> int | None:
    """The number of routed experts named by a model config, its `hf_config` / `text_config`, or its overrides;
    None when none of them names it."""
    nested = {"hf_config": ("text_config",), "text_config": (), "override_config": ("model_config", "text_config")}
    places = [model_config]
    for outer, inners in nested.items():
        sub = _field(model_config, outer)
        if sub is not None:
            places.append(sub)
            places.extend(x for x in (_field(sub, inner) for inner in inners) if x is not None)
    for cfg in places:
        for name in ("num_experts", "n_routed_experts"):
            if _field(cfg, name) is not None:
                return int(_field(cfg, name))
        if _field(cfg, "model_type") in _LOCAL_EXPERTS_ARE_GLOBAL and _field(cfg, "num_local_experts") is not None:
            return int(_field(cfg, "num_local_experts"))
    return None


def infer_rollout_moe_num_experts(model_config: Any) -> int | None:
    """`infer_moe_num_experts`, falling back to the model's Hugging Face config (with the overrides applied)."""
    found = infer_moe_num_experts(model_config)
    if found is not None:
        return found
    path = next((v for v in (_field(model_config, k) for k in ("local_hf_config_path", "hf_config_path", "path"))
                 if v), None)
    if path is None:
        return None
    local = copy_to_local(path, use_shm=_field(model_config, "use_shm", False))
    hf_config = AutoConfig.from_pretrained(local, trust_remote_code=_field(model_config, "trust_remote_code", False))
    overrides = get_hf_config_override_kwargs(_field(model_config, "override_config", {}))
    if overrides:
        update_model_config(hf_config, overrides)
    return infer_moe_num_experts(hf_config)


def _compute_rollout_moe_load_counts(routed_experts, response_mask, num_experts):
    """(layers, num_experts) counts of expert assignments over the response tokens; None when there is nothing
    to count or the inputs do not fit.

    Each sequence's last valid response position is left out: the last sampled token is never fed back through
    the model, so its slot holds filler, not a routing record."""
    if routed_experts is None or response_mask is None or not num_experts or num_experts <= 0:
        return None
    if routed_experts.dim() != 4:
        logger.warning("routed_experts should be (batch, seq, layers, top_k), got shape %s", tuple(routed_experts.shape))
        return None
    if response_mask.dim() != 2 or response_mask.shape[0] != routed_experts.shape[0]:
        logger.warning("response_mask %s does not fit routed_experts %s", tuple(response_mask.shape),
                       tuple(routed_experts.shape))
        return None
    width = response_mask.shape[1]
    if width == 0:
        return None
    if routed_experts.shape[1] < width:
        logger.warning("routed_experts covers %s positions, fewer than the %s response positions",
                       routed_experts.shape[1], width)
        return None
    response = routed_experts[:, routed_experts.shape[1] - width:]
    mask = response_mask.to(device=response.device, dtype=torch.bool)
    pos = torch.arange(width, device=mask.device)
    last = torch.where(mask, pos, torch.full_like(pos, -1)).amax(dim=1)  # -1: no valid position
    mask = mask & (pos.unsqueeze(0) != last.unsqueeze(1))
    picked = response[mask].detach().to("cpu", torch.long)  # (tokens, layers, top_k)
    if picked.numel() == 0:
        return None
    if picked.min() < 0 or picked.max() >= num_experts:
        logger.warning("rollout MoE load-balance metrics skipped: expert ids span [%s, %s], outside [0, %s)",
                       picked.min().item(), picked.max().item(), num_experts)
        return None
    return torch.stack([torch.bincount(picked[:, layer].reshape(-1), minlength=num_experts)
                        for layer in range(picked.shape[1])])


def _moe_metrics_from_counts(counts, prefix: str = "rollout/moe") -> dict[str, Any]:
    """Per layer, each expert's share of the assignments times the number of experts, minus 1 (0: perfectly
    even): its max, min and mean absolute value per layer, then the max and mean of each over the layers."""
    if counts is None or counts.numel() == 0:
        return {}
    share = counts.float() / counts.float().sum(dim=1, keepdim=True).clamp_min(1.0)
    deviation = share * share.shape[1] - 1.0
    stats = {"max_vio": deviation.amax(dim=1), "min_vio": deviation.amin(dim=1), "avg_vio": deviation.abs().mean(dim=1)}
    metrics: dict[str, Any] = {}
    for layer in range(share.shape[0]):
        for name, per_layer in stats.items():
            metrics[f"{prefix}/{name}/layer_{layer}"] = per_layer[layer].item()
    for name, per_layer in stats.items():
        metrics[f"{prefix}/{name}/max"] = per_layer.max().item()
        metrics[f"{prefix}/{name}/avg"] = per_layer.mean().item()
    return metrics


def compute_rollout_moe_load_balance_metrics(routed_experts, response_mask, num_experts,
                                             prefix: str = "rollout/moe") -> dict[str, Any]:
    """Load-balance metrics of one batch (see `_moe_metrics_from_counts`); {} when there is nothing to count."""
    counts = _compute_rollout_moe_load_counts(routed_experts, response_mask, num_experts)
    return _moe_metrics_from_counts(counts, prefix=prefix)


class RolloutMoELoadBalanceMetricsAccumulator:
    """Expert-assignment counts summed over several steps, reported every `moe_lb_metrics_interval` steps."""

    def __init__(self, model_config: Any | None = None):
        self.model_config = model_config
        self.load_counts = None
        self.num_experts: int | None = None
        self.num_experts_initialized = False
        self.routed_experts_retry_after_step = 0
        self.warned_skip_keys: set[str] = set()

    def should_request_routed_experts(self, global_steps: int) -> bool:
        return global_steps >= self.routed_experts_retry_after_step

    def defer_routed_experts_retry(self, global_steps: int, interval: int) -> None:
        self.routed_experts_retry_after_step = global_steps + max(interval, 1)

    def warn_skip_once(self, key: str, message: str) -> None:
        if key not in self.warned_skip_keys:
            self.warned_skip_keys.add(key)
            logger.warning(message)

    def _infer_num_experts(self) -> int | None:
        if not self.num_experts_initialized:
            self.num_experts_initialized = True
            if self.model_config is not None:
                try:
                    self.num_experts = infer_rollout_moe_num_experts(self.model_config)
                except Exception as exc:  # a config that cannot be read only costs the metric
                    self.warn_skip_once("num_experts_exception", f"could not read the MoE expert count: {exc}")
            if self.num_experts is None:
                self.warn_skip_once("num_experts_missing", "rollout MoE load-balance metrics skipped: the number of "
                                    "experts is not in actor_rollout_ref.model nor in the Hugging Face config")
        return self.num_experts

    def update(self, routed_experts, response_mask, num_experts: int | None = None) -> bool:
        """Add one batch's counts; False when it had none."""
        counts = _compute_rollout_moe_load_counts(
            routed_experts, response_mask, num_experts if num_experts is not None else self._infer_num_experts())
        if counts is None:
            return False
        if self.load_counts is not None and self.load_counts.shape != counts.shape:
            logger.warning("rollout MoE counts changed shape %s -> %s: starting over", tuple(self.load_counts.shape),
                           tuple(counts.shape))
            self.load_counts = None
        self.load_counts = counts if self.load_counts is None else self.load_counts + counts
        return True

    def total_assignments(self) -> int:
        return 0 if self.load_counts is None else int(self.load_counts.sum().item())

    def compute(self, prefix: str = "rollout/moe") -> dict[str, Any]:
        return _moe_metrics_from_counts(self.load_counts, prefix=prefix)

    def reset(self) -> None:
        self.load_counts = None

    def pop_metrics(self, prefix: str = "rollout/moe") -> dict[str, Any]:
        metrics = self.compute(prefix=prefix)
        self.reset()
        return metrics


def compute_moe_lb_metrics(metrics_batch, moe_lb_metrics_interval: int, global_steps: int,
                           accumulator: RolloutMoELoadBalanceMetricsAccumulator) -> dict[str, Any]:
    """Add this step's counts; on every `moe_lb_metrics_interval`-th step return the metrics of the steps since
    the last report (with `routed_experts_found` and `routed_expert_assignments`) and start over."""
    if moe_lb_metrics_interval <= 0:
        return {}
    updated = accumulator.update(metrics_batch.batch.get("routed_experts", None),
                                 metrics_batch.batch.get("response_mask", None))
    if global_steps % moe_lb_metrics_interval:
        return {}
    assignments = accumulator.total_assignments()
    metrics = accumulator.pop_metrics()
    metrics["rollout/moe/routed_experts_found"] = float(assignments > 0)
    metrics["rollout/moe/routed_expert_assignments"] = assignments
    if not updated and assignments == 0:
        accumulator.warn_skip_once("no_routed_expert_counts",
                                   "rollout MoE load-balance metrics skipped: no routed expert records were found")
    return metrics


def get_metric_data_with_optional_routed_experts(keys: list[str], partition_id: str, fields: list[str],
                                                 moe_lb_metrics_interval: int, global_steps: int,
                                                 accumulator: RolloutMoELoadBalanceMetricsAccumulator,
                                                 kv_batch_get: Callable[..., Any]):
    """Fetch `fields` through `kv_batch_get`, asking for `routed_experts` too while the metric is on; a store
    without that field is asked again without it, and not asked for it again before the next interval."""
    if moe_lb_metrics_interval <= 0 or not accumulator.should_request_routed_experts(global_steps):
        return kv_batch_get(keys=keys, partition_id=partition_id, select_fields=fields)
    try:
        return kv_batch_get(keys=keys, partition_id=partition_id, select_fields=[*fields, "routed_experts"])
    except ValueError as exc:
        if "routed_experts" not in str(exc):
            raise
        accumulator.defer_routed_experts_retry(global_steps, moe_lb_metrics_interval)
        accumulator.warn_skip_once("missing_routed_experts", f"rollout MoE load-balance metrics skipped: {exc}")
        return kv_batch_get(keys=keys, partition_id=partition_id, select_fields=fields)
