"""The PPO-family math: advantage estimators, policy/value losses, loss aggregation and KL.

Function names, keyword arguments and registry names follow upstream verl 0.9.1 so user code that
registers its own estimator or policy loss keeps working. Every function works on padded
(batch, response_length) tensors plus a response mask; nothing here knows about devices or workers.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Callable

import numpy as np
import torch

import verl.utils.torch_functional as verl_F

__all__ = [
    "AdaptiveKLController",
    "AdvantageEstimator",
    "FixedKLController",
    "agg_loss",
    "compute_gae_advantage_return",
    "compute_grpo_outcome_advantage",
    "compute_policy_loss",
    "compute_policy_loss_vanilla",
    "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_rewards",
    "compute_rloo_outcome_advantage",
    "compute_value_loss",
    "compute_entropy_loss",
    "get_adv_estimator_fn",
    "get_kl_controller",
    "get_policy_loss_fn",
    "kl_penalty",
    "register_adv_est",
    "register_policy_loss",
]

LOSS_AGG_MODES = ("token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm")


def _cfg(config, key: str, default=None):
    """Read `key` from a DictConfig, a plain dict or a dataclass, falling back to `default`."""
    if config is None:
        return default
    if isinstance(config, dict) or hasattr(config, "get") and not hasattr(config, "__dataclass_fields__"):
        value = config.get(key, default)
    else:
        value = getattr(config, key, default)
    return default if value is None else value


# --------------------------------------------------------------------------- registries


class AdvantageEstimator(str, Enum):
    """Names accepted by `algorithm.adv_estimator`; custom names can be added with `register_adv_est`."""

    GAE = "gae"
    GRPO = "grpo"
    REINFORCE_PLUS_PLUS = "reinforce_plus_plus"
    REINFORCE_PLUS_PLUS_BASELINE = "reinforce_plus_plus_baseline"
    RLOO = "rloo"


ADV_ESTIMATOR_REGISTRY: dict[str, Callable] = {}
POLICY_LOSS_REGISTRY: dict[str, Callable] = {}


def _name(name_or_enum) -> str:
    return name_or_enum.value if isinstance(name_or_enum, Enum) else str(name_or_enum)


def register_adv_est(name_or_enum):
    """Decorator: make an advantage estimator available under `algorithm.adv_estimator=<name>`."""

    def decorator(fn):
        name = _name(name_or_enum)
        if ADV_ESTIMATOR_REGISTRY.get(name, fn) is not fn:
            raise ValueError(f"advantage estimator {name!r} is already registered to {ADV_ESTIMATOR_REGISTRY[name]}")
        ADV_ESTIMATOR_REGISTRY[name] = fn
        return fn

    return decorator


def get_adv_estimator_fn(name_or_enum):
    name = _name(name_or_enum)
    if name not in ADV_ESTIMATOR_REGISTRY:
        raise ValueError(
            f"unknown advantage estimator {name!r}; algorithm.adv_estimator must be one of "
            f"{sorted(ADV_ESTIMATOR_REGISTRY)} or a name registered with register_adv_est"
        )
    return ADV_ESTIMATOR_REGISTRY[name]


def register_policy_loss(name: str):
    """Decorator: make a policy loss available under `actor.policy_loss.loss_mode=<name>`."""

    def decorator(fn):
        POLICY_LOSS_REGISTRY[name] = fn
        return fn

    return decorator


def get_policy_loss_fn(name: str):
    if name not in POLICY_LOSS_REGISTRY:
        raise ValueError(
            f"unsupported policy loss mode {name!r}; actor.policy_loss.loss_mode must be one of "
            f"{sorted(POLICY_LOSS_REGISTRY)}"
        )
    return POLICY_LOSS_REGISTRY[name]


# --------------------------------------------------------------------------- KL controllers


class AdaptiveKLController:
    """KL coefficient that moves toward a target KL (Ziegler et al. 2019, arXiv:1909.08593)."""

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: int):
        self.value = init_kl_coef
        self.target = target_kl
        self.horizon = horizon

    def update(self, current_kl: float, n_steps: int) -> None:
        error = float(np.clip(current_kl / self.target - 1.0, -0.2, 0.2))
        self.value *= 1.0 + error * n_steps / self.horizon


class FixedKLController:
    """Constant KL coefficient; `update` exists so the trainer treats both controllers alike."""

    def __init__(self, kl_coef: float):
        self.value = kl_coef

    def update(self, current_kl: float, n_steps: int) -> None:
        return None


def get_kl_controller(kl_ctrl):
    """Build the controller described by `algorithm.kl_ctrl` (type fixed|adaptive)."""
    kind = _cfg(kl_ctrl, "type")
    if kind == "fixed":
        return FixedKLController(kl_coef=_cfg(kl_ctrl, "kl_coef"))
    if kind == "adaptive":
        horizon = _cfg(kl_ctrl, "horizon")
        if not horizon or horizon <= 0:
            raise ValueError(f"algorithm.kl_ctrl.horizon must be > 0 for the adaptive controller, got {horizon}")
        return AdaptiveKLController(
            init_kl_coef=_cfg(kl_ctrl, "kl_coef"), target_kl=_cfg(kl_ctrl, "target_kl"), horizon=horizon
        )
    raise ValueError(f"algorithm.kl_ctrl.type must be 'fixed' or 'adaptive', got {kind!r}")


# --------------------------------------------------------------------------- advantage estimators


def _group_ids(index) -> tuple[torch.Tensor, int]:
    """Map arbitrary group labels (e.g. prompt uids) to 0..G-1."""
    labels = np.asarray(index, dtype=object) if not isinstance(index, torch.Tensor) else index.cpu().numpy()
    _, inverse = np.unique(np.asarray([str(x) for x in labels]), return_inverse=True)
    inverse = torch.as_tensor(inverse.reshape(-1), dtype=torch.long)
    return inverse, int(inverse.max()) + 1 if inverse.numel() else 0


def _group_stats(scores: torch.Tensor, index):
    """Per-row group size, group mean and unbiased group std, computed in float64."""
    gid, n_groups = _group_ids(index)
    gid = gid.to(scores.device)
    x = scores.double()
    count = torch.zeros(n_groups, dtype=torch.float64, device=x.device).index_add_(0, gid, torch.ones_like(x))
    total = torch.zeros_like(count).index_add_(0, gid, x)
    mean = total / count
    sq_dev = torch.zeros_like(count).index_add_(0, gid, (x - mean[gid]) ** 2)
    std = torch.sqrt(sq_dev / (count - 1).clamp(min=1))
    return count[gid], mean[gid], std[gid]


@register_adv_est(AdvantageEstimator.GAE)
def compute_gae_advantage_return(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma,
    lam,
):
    """Generalised Advantage Estimation (arXiv:1506.02438); advantages are whitened over the batch.

    Masked positions inside a response (e.g. tool observations) are skipped: the recursion carries
    the next value and the running advantage across them unchanged. Returns are the raw
    (un-whitened) advantages plus values, the critic's regression target.
    """
    with torch.no_grad():
        mask = response_mask.to(values.dtype)
        next_value = torch.zeros_like(values[:, 0])
        running = torch.zeros_like(values[:, 0])
        advantages = torch.zeros_like(values)
        for t in range(values.shape[1] - 1, -1, -1):
            delta = token_level_rewards[:, t] + gamma * next_value - values[:, t]
            candidate = delta + gamma * lam * running
            m = mask[:, t]
            running = m * candidate + (1 - m) * running
            next_value = m * values[:, t] + (1 - m) * next_value
            advantages[:, t] = running
        returns = advantages + values
        advantages = verl_F.masked_whiten(advantages, response_mask)
    return advantages, returns


@register_adv_est(AdvantageEstimator.GRPO)
def compute_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    config=None,
):
    """GRPO: each response's score minus its group's mean, divided by the group's std.

    Groups are the rows sharing an `index` value (the prompt uid). A group of one has no baseline:
    its advantage is the raw score. `norm_adv_by_std_in_grpo=False` skips the division (Dr.GRPO).
    """
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        count, mean, std = _group_stats(scores, index)
        single = count == 1
        mean = torch.where(single, torch.zeros_like(mean), mean)
        std = torch.where(single, torch.ones_like(std), std)
        adv = scores.double() - mean
        if norm_adv_by_std_in_grpo:
            adv = adv / (std + epsilon)
        adv = adv.to(scores.dtype).unsqueeze(-1) * response_mask
    return adv, adv


@register_adv_est(AdvantageEstimator.RLOO)
def compute_rloo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    config=None,
    **kwargs,
):
    """RLOO (arXiv:2402.14740): the baseline is the mean score of the *other* responses in the group."""
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        count, mean, _ = _group_stats(scores, index)
        x = scores.double()
        leave_one_out = (x - mean) * count / (count - 1).clamp(min=1)
        adv = torch.where(count > 1, leave_one_out, x)
        adv = adv.to(scores.dtype).unsqueeze(-1) * response_mask
    return adv, adv


@register_adv_est(AdvantageEstimator.REINFORCE_PLUS_PLUS_BASELINE)
def compute_reinforce_plus_plus_baseline_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index,
    epsilon: float = 1e-6,
    config=None,
    **kwargs,
):
    """REINFORCE++ with a group-mean baseline (arXiv:2501.03262), then whitened over the batch."""
    with torch.no_grad():
        scores = token_level_rewards.sum(dim=-1)
        count, mean, _ = _group_stats(scores, index)
        centred = (scores.double() - torch.where(count > 1, mean, torch.zeros_like(mean))).to(scores.dtype)
        adv = centred.unsqueeze(-1).expand_as(response_mask).to(scores.dtype) * response_mask
        adv = verl_F.masked_whiten(adv, response_mask) * response_mask
    return adv, adv


@register_adv_est(AdvantageEstimator.REINFORCE_PLUS_PLUS)
def compute_reinforce_plus_plus_outcome_advantage(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, config=None, **kwargs
):
    """REINFORCE++ (arXiv:2501.03262): discounted returns (gamma from `config`), whitened over the batch.

    As in GAE, masked positions inside a response pass the running return through unchanged.
    """
    if config is None:
        raise ValueError("compute_reinforce_plus_plus_outcome_advantage needs config (the algorithm config, for gamma)")
    gamma = _cfg(config, "gamma", 1.0)
    with torch.no_grad():
        mask = response_mask.to(token_level_rewards.dtype)
        returns = torch.zeros_like(token_level_rewards)
        running = torch.zeros_like(token_level_rewards[:, 0])
        for t in range(token_level_rewards.shape[1] - 1, -1, -1):
            candidate = token_level_rewards[:, t] + gamma * running
            m = mask[:, t]
            returns[:, t] = candidate * m
            running = m * candidate + (1 - m) * running
        advantages = verl_F.masked_whiten(returns, response_mask) * response_mask
    return advantages, returns


def compute_rewards(token_level_scores, old_log_prob, ref_log_prob, kl_ratio):
    """Scores minus kl_ratio times the k1 KL estimate, token by token (KL in the reward)."""
    return token_level_scores - (old_log_prob - ref_log_prob) * kl_ratio


# --------------------------------------------------------------------------- loss aggregation


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    dp_size: int = 1,
    batch_num_tokens=None,
    global_batch_size=None,
    loss_scale_factor=None,
):
    """Reduce a (batch, length) loss matrix to a scalar.

    Modes: token-mean (over all valid tokens), token-sum, seq-mean-token-sum (mean over sequences of
    per-sequence sums), seq-mean-token-mean (mean over sequences of per-sequence means) and
    seq-mean-token-sum-norm (seq-mean-token-sum divided by `loss_scale_factor`, by default the padded
    response length, so the scale does not depend on how long the sampled responses were).

    For data parallelism, pass the global denominators (`batch_num_tokens` for token-mean,
    `global_batch_size` for the seq modes) and `dp_size`: each rank's loss is multiplied by
    dp_size because gradient all-reduce averages over ranks. Fully masked rows never count as sequences,
    and a fully masked micro-batch gives 0, not NaN.
    """
    mask = loss_mask.to(loss_mat.dtype)
    if loss_agg_mode == "token-mean":
        if batch_num_tokens is None:
            if dp_size > 1:
                raise ValueError("agg_loss(token-mean) needs the global batch_num_tokens when dp_size > 1")
            batch_num_tokens = mask.sum().clamp(min=1)
        return verl_F.masked_sum(loss_mat, mask) / batch_num_tokens * dp_size
    if loss_agg_mode == "token-sum":
        return verl_F.masked_sum(loss_mat, mask) * dp_size
    if loss_agg_mode in ("seq-mean-token-sum", "seq-mean-token-sum-norm", "seq-mean-token-mean"):
        tokens_per_seq = mask.sum(dim=-1)
        seq_loss = verl_F.masked_sum(loss_mat, mask, axis=-1)
        if loss_agg_mode == "seq-mean-token-mean":
            seq_loss = seq_loss / (tokens_per_seq + 1e-8)
        has_tokens = (tokens_per_seq > 0).to(loss_mat.dtype)
        if global_batch_size is None:
            if dp_size > 1:
                raise ValueError(f"agg_loss({loss_agg_mode}) needs the global global_batch_size when dp_size > 1")
            global_batch_size = has_tokens.sum().clamp(min=1)
        loss = verl_F.masked_sum(seq_loss, has_tokens) / global_batch_size * dp_size
        if loss_agg_mode == "seq-mean-token-sum-norm":
            loss = loss / (loss_mask.shape[-1] if loss_scale_factor is None else loss_scale_factor)
        return loss
    raise ValueError(f"invalid loss_agg_mode {loss_agg_mode!r}; choose one of {list(LOSS_AGG_MODES)}")


# --------------------------------------------------------------------------- policy and value losses


def _dual_clip_ppo(old_log_prob, log_prob, advantages, response_mask, clip_low, clip_high, clip_ratio_c):
    """Per-token dual-clip PPO loss (arXiv:1707.06347, arXiv:1912.09729) and its statistics."""
    if clip_ratio_c <= 1.0:
        raise ValueError(f"actor.clip_ratio_c (dual-clip lower bound) must be > 1.0, got {clip_ratio_c}")
    log_ratio = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(log_ratio)
    ppo_kl = verl_F.masked_mean(-log_ratio, response_mask)

    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    ppo_loss = torch.maximum(unclipped, clipped)
    clipfrac = verl_F.masked_mean((clipped > unclipped).float(), response_mask)

    # For negative advantages the loss -A*ratio grows without bound in ratio; cap it at -A*c.
    cap = -advantages * clip_ratio_c
    negative = advantages < 0
    clipfrac_lower = verl_F.masked_mean(((ppo_loss > cap) & negative).float(), response_mask)
    per_token = torch.where(negative, torch.minimum(ppo_loss, cap), ppo_loss)
    return per_token, clipfrac, ppo_kl, clipfrac_lower


def compute_policy_loss(
    old_log_prob,
    log_prob,
    advantages,
    response_mask,
    cliprange=None,
    cliprange_low=None,
    cliprange_high=None,
    clip_ratio_c=3.0,
    loss_agg_mode: str = "token-mean",
):
    """Dual-clip PPO policy loss with explicit clip ranges (upstream's older entry point).

    Returns (pg_loss, pg_clipfrac, ppo_kl, pg_clipfrac_lower). `cliprange_low`/`cliprange_high`
    default to `cliprange`, giving the symmetric clip of standard PPO.
    """
    clip_low = cliprange if cliprange_low is None else cliprange_low
    clip_high = cliprange if cliprange_high is None else cliprange_high
    if clip_low is None or clip_high is None:
        raise ValueError("compute_policy_loss needs cliprange (or both cliprange_low and cliprange_high)")
    per_token, clipfrac, ppo_kl, clipfrac_lower = _dual_clip_ppo(
        old_log_prob, log_prob, advantages, response_mask, clip_low, clip_high, clip_ratio_c
    )
    pg_loss = agg_loss(loss_mat=per_token, loss_mask=response_mask, loss_agg_mode=loss_agg_mode)
    return pg_loss, clipfrac, ppo_kl, clipfrac_lower


@register_policy_loss("vanilla")
def compute_policy_loss_vanilla(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config=None,
    rollout_is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Registered dual-clip PPO loss; clip settings come from the actor config.

    Reads clip_ratio, clip_ratio_low, clip_ratio_high, clip_ratio_c and, if present, the dict
    `global_batch_info` (dp_size, batch_num_tokens, global_batch_size, loss_scale_factor) that the
    actor fills in for globally normalised aggregation. Returns (pg_loss, metrics) with upstream's
    metric names; the metric values are detached 0-d tensors, so the actor's micro-batch loop does not
    wait for the device (it reads them once per mini-batch).
    """
    if config is None:
        raise ValueError("compute_policy_loss_vanilla needs config (the actor config, for the clip ratios)")
    clip_ratio = _cfg(config, "clip_ratio", 0.2)
    clip_low = _cfg(config, "clip_ratio_low", clip_ratio)
    clip_high = _cfg(config, "clip_ratio_high", clip_ratio)
    clip_ratio_c = _cfg(config, "clip_ratio_c", 3.0)
    per_token, clipfrac, ppo_kl, clipfrac_lower = _dual_clip_ppo(
        old_log_prob, log_prob, advantages, response_mask, clip_low, clip_high, clip_ratio_c
    )
    if rollout_is_weights is not None:
        per_token = per_token * rollout_is_weights
    batch_info = dict(_cfg(config, "global_batch_info", {}) or {})
    pg_loss = agg_loss(loss_mat=per_token, loss_mask=response_mask, loss_agg_mode=loss_agg_mode, **batch_info)
    metrics = {
        "actor/pg_clipfrac": clipfrac.detach(),
        "actor/ppo_kl": ppo_kl.detach(),
        "actor/pg_clipfrac_lower": clipfrac_lower.detach(),
    }
    return pg_loss, metrics


def compute_entropy_loss(logits, response_mask, loss_agg_mode: str = "token-mean"):
    """Aggregated per-token entropy of the policy (the actor subtracts entropy_coeff times this)."""
    return agg_loss(verl_F.entropy_from_logits(logits), response_mask, loss_agg_mode)


def compute_value_loss(
    vpreds: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
    dp_size: int = 1,
    batch_num_tokens=None,
    global_batch_size=None,
    loss_scale_factor=None,
):
    """Clipped value loss: 0.5 * max((v - R)^2, (clip(v, v_old +- c) - R)^2), aggregated.

    Returns (vf_loss, vf_clipfrac), the latter the fraction of tokens where the clipped term won.
    """
    vpred_clipped = verl_F.clip_by_value(vpreds, values - cliprange_value, values + cliprange_value)
    loss_unclipped = (vpreds - returns) ** 2
    loss_clipped = (vpred_clipped - returns) ** 2
    vf_loss = 0.5 * agg_loss(
        loss_mat=torch.maximum(loss_unclipped, loss_clipped),
        loss_mask=response_mask,
        loss_agg_mode=loss_agg_mode,
        dp_size=dp_size,
        batch_num_tokens=batch_num_tokens,
        global_batch_size=global_batch_size,
        loss_scale_factor=loss_scale_factor,
    )
    vf_clipfrac = verl_F.masked_mean((loss_clipped > loss_unclipped).float(), response_mask)
    return vf_loss, vf_clipfrac


# --------------------------------------------------------------------------- KL estimators


# Estimator names `kl_penalty` takes; each also with a trailing '+' (config_check lists both forms,
# a test keeps the two in step).
KL_ESTIMATORS = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")


def _kl_estimate(logprob: torch.Tensor, ref_logprob: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token estimators of KL(policy || ref) from sampled log-probs (Schulman's k1/k2/k3)."""
    diff = logprob - ref_logprob
    if kind in ("kl", "k1"):
        return diff
    if kind == "abs":
        return diff.abs()
    if kind in ("mse", "k2"):
        return 0.5 * diff.square()
    if kind in ("low_var_kl", "k3"):
        log_r = torch.clamp(-diff, min=-20.0, max=20.0)
        return torch.clamp(torch.exp(log_r) - log_r - 1.0, min=-10.0, max=10.0)
    raise ValueError(
        f"unsupported KL estimator {kind!r}; use one of {', '.join(KL_ESTIMATORS)} "
        "(append '+' for a k2 gradient with the chosen estimator's value)"
    )


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """KL estimate named by `kl_penalty` (algorithm.kl_penalty or actor.kl_loss_type).

    A trailing '+' (e.g. "k3+") keeps that estimator's value but takes the gradient of k2, whose
    gradient is the unbiased one (straight-through).
    """
    straight_through = kl_penalty.endswith("+")
    kind = kl_penalty[:-1] if straight_through else kl_penalty
    value = _kl_estimate(logprob, ref_logprob, kind)
    if not straight_through or kind in ("mse", "k2"):
        return value
    k2 = 0.5 * (logprob - ref_logprob).square()
    return k2 - k2.detach() + value.detach()
