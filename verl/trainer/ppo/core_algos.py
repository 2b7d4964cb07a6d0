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
    "compute_gdpo_outcome_advantage",
    "compute_gpg_outcome_advantage",
    "compute_grpo_outcome_advantage",
    "compute_grpo_passk_outcome_advantage",
    "compute_grpo_vectorized_outcome_advantage",
    "compute_opo_outcome_advantage",
    "compute_policy_loss",
    "compute_optimal_token_baseline_advantage",
    "compute_policy_loss_cispo",
    "compute_policy_loss_clip_cov",
    "compute_policy_loss_dppo_kl",
    "compute_policy_loss_dppo_tv",
    "compute_policy_loss_dro",
    "compute_policy_loss_geo_mean",
    "compute_policy_loss_gpg",
    "compute_policy_loss_gspo",
    "compute_policy_loss_kl_cov",
    "compute_policy_loss_reinforce",
    "compute_policy_loss_sapo",
    "compute_policy_loss_vanilla",
    "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_rewards",
    "compute_remax_outcome_advantage",
    "compute_rloo_outcome_advantage",
    "compute_rloo_vectorized_outcome_advantage",
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
    REMAX = "remax"
    RLOO = "rloo"
    OPO = "opo"
    GRPO_PASSK = "grpo_passk"
    GPG = "gpg"
    RLOO_VECTORIZED = "rloo_vectorized"
    GRPO_VECTORIZED = "grpo_vectorized"
    GDPO = "gdpo"


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
            # upstream's first sentence, which callers match; then what to change
            f"Unknown advantage estimator simply: {name}. algorithm.adv_estimator must be one of "
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


def _group_sum(values: torch.Tensor, gid: torch.Tensor, n_groups: int) -> torch.Tensor:
    """For each row, the float64 sum of `values` over the rows of its group."""
    values = values.double()
    return torch.zeros(n_groups, dtype=torch.float64, device=values.device).index_add_(0, gid, values)[gid]


def _scores_and_groups(token_level_rewards, index):
    """Sequence scores in float64 and each row's group number (0..G-1)."""
    gid, n_groups = _group_ids(index)
    return token_level_rewards.sum(dim=-1).double(), gid.to(token_level_rewards.device), n_groups


def _group_stats(scores: torch.Tensor, index):
    """Per-row group size, group mean and unbiased group std, computed in float64."""
    gid, n_groups = _group_ids(index)
    gid = gid.to(scores.device)
    x = scores.double()
    count = _group_sum(torch.ones_like(x), gid, n_groups)
    mean = _group_sum(x, gid, n_groups) / count
    std = torch.sqrt(_group_sum((x - mean) ** 2, gid, n_groups) / (count - 1).clamp(min=1))
    return count, mean, std


@register_adv_est(AdvantageEstimator.GAE)
def compute_gae_advantage_return(token_level_rewards: torch.Tensor, values: torch.Tensor, response_mask: torch.Tensor,
                                 gamma, lam):
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
def compute_grpo_outcome_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: np.ndarray,
                                   epsilon: float = 1e-6, norm_adv_by_std_in_grpo: bool = True, config=None):
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
def compute_rloo_outcome_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: np.ndarray,
                                   epsilon: float = 1e-6, config=None, **kwargs):
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
def compute_reinforce_plus_plus_baseline_outcome_advantage(token_level_rewards: torch.Tensor,
                                                           response_mask: torch.Tensor, index, epsilon: float = 1e-6,
                                                           config=None, **kwargs):
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


def _broadcast(per_row: torch.Tensor, like: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    return per_row.to(like.dtype).unsqueeze(-1) * response_mask


@register_adv_est(AdvantageEstimator.GRPO_VECTORIZED)
def compute_grpo_vectorized_outcome_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor,
                                              index: np.ndarray, epsilon: float = 1e-6,
                                              norm_adv_by_std_in_grpo: bool = True, config=None):
    """GRPO computed with scatter sums instead of a per-group loop: the same advantages as `grpo`
    (a group of one keeps its raw score, std 1)."""
    return compute_grpo_outcome_advantage(token_level_rewards, response_mask, index, epsilon,
                                          _cfg(config, "norm_adv_by_std_in_grpo", norm_adv_by_std_in_grpo))


@register_adv_est(AdvantageEstimator.RLOO_VECTORIZED)
def compute_rloo_vectorized_outcome_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor,
                                              index: np.ndarray, epsilon: float = 1e-6, config=None, **kwargs):
    """RLOO (arXiv:2402.14740) with scatter sums: r_i minus the mean of the group's other responses.
    Unlike the looped `rloo`, a group of one gets advantage 0 (it has no other response to compare)."""
    with torch.no_grad():
        scores, gid, n_groups = _scores_and_groups(token_level_rewards, index)
        count = _group_sum(torch.ones_like(scores), gid, n_groups)
        adv = (count * scores - _group_sum(scores, gid, n_groups)) / (count - 1).clamp(min=1) * (count > 1)
        adv = _broadcast(adv, token_level_rewards, response_mask)
    return adv, adv


@register_adv_est(AdvantageEstimator.OPO)
def compute_opo_outcome_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: np.ndarray,
                                  epsilon: float = 1e-6, config=None, **kwargs):
    """OPO (arXiv:2505.23585): the baseline is the group's length-weighted mean score,
    b = sum_j |o_j| r_j / sum_j |o_j|, the variance-optimal baseline for on-policy sampling.
    A group of one has baseline 0."""
    with torch.no_grad():
        scores, gid, n_groups = _scores_and_groups(token_level_rewards, index)
        lengths = response_mask.sum(dim=-1).double()
        count = _group_sum(torch.ones_like(scores), gid, n_groups)
        weighted = _group_sum(lengths * scores, gid, n_groups)
        total_len = _group_sum(lengths, gid, n_groups)
        baseline = torch.where(count > 1, weighted / total_len.clamp(min=1), torch.zeros_like(scores))
        adv = _broadcast(scores - baseline, token_level_rewards, response_mask)
    return adv, adv


@register_adv_est(AdvantageEstimator.GRPO_PASSK)
def compute_grpo_passk_outcome_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor,
                                         index: np.ndarray, epsilon: float = 1e-6, norm_adv_by_std_in_grpo: bool = True,
                                         config=None, **kwargs):
    """Pass@k training (arXiv:2503.19595): only each group's best response is credited, with
    r_max - r_second (divided by the group's unbiased std + epsilon unless
    `algorithm.norm_adv_by_std_in_grpo=false`); every other response gets 0. Needs rollout.n >= 2."""
    norm = _cfg(config, "norm_adv_by_std_in_grpo", norm_adv_by_std_in_grpo)
    with torch.no_grad():
        scores, gid, n_groups = _scores_and_groups(token_level_rewards, index)
        adv = torch.zeros_like(scores)
        for g in range(n_groups):
            rows = torch.nonzero(gid == g).flatten()
            if rows.numel() < 2:
                raise ValueError(f"grpo_passk needs at least 2 responses per prompt (set actor_rollout_ref.rollout.n "
                                 f">= 2); a group has {rows.numel()}")
            top = torch.topk(scores[rows], 2)
            value = top.values[0] - top.values[1]
            if norm:
                value = value / (scores[rows].std() + epsilon)
            adv[rows[top.indices[0]]] = value
        adv = _broadcast(adv, token_level_rewards, response_mask)
    return adv, adv


@register_adv_est(AdvantageEstimator.GPG)
def compute_gpg_outcome_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: np.ndarray,
                                  epsilon: float = 1e-6, f_norm: float = 1.0, alpha: float = 1.0, config=None,
                                  **kwargs):
    """GPG (arXiv:2504.02546): (r_i - group mean) * alpha / f_norm, where alpha = batch size / number
    of non-zero scores corrects for groups whose responses all scored 0. A group of one has mean 0.
    (As upstream, the `alpha` argument is replaced by that batch correction.)"""
    with torch.no_grad():
        scores, gid, n_groups = _scores_and_groups(token_level_rewards, index)
        alpha = scores.numel() / max(int(torch.count_nonzero(scores)), 1)
        count = _group_sum(torch.ones_like(scores), gid, n_groups)
        mean = _group_sum(scores, gid, n_groups) / count
        mean = torch.where(count > 1, mean, torch.zeros_like(mean))
        adv = _broadcast(alpha * (scores - mean) / f_norm, token_level_rewards, response_mask)
    return adv, adv


@register_adv_est(AdvantageEstimator.REMAX)
def compute_remax_outcome_advantage(token_level_rewards: torch.Tensor, reward_baselines: torch.Tensor,
                                    response_mask: torch.Tensor, config=None, **kwargs):
    """ReMax (arXiv:2310.10505): returns-to-go minus the reward of the greedy response to the same
    prompt (`reward_baselines`, one per row, filled by the trainer's greedy baseline rollout)."""
    with torch.no_grad():
        returns = (token_level_rewards * response_mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])
        advantages = returns - reward_baselines.to(returns.dtype).unsqueeze(-1) * response_mask
    return advantages, returns


@register_adv_est(AdvantageEstimator.GDPO)
def compute_gdpo_outcome_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, index: np.ndarray,
                                   epsilon: float = 1e-6, norm_adv_by_std_in_grpo: bool = True, config=None,
                                   non_tensor_batch: dict | None = None, batch: dict | None = None,
                                   **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """GDPO (arXiv:2601.05242): each reward component is normalised within its prompt group on its own (GRPO
    per component), the results summed with `gdpo_reward_weights` (default 1 each), and the sum whitened over
    the batch's response tokens. The components are the per-sample columns `config.gdpo_reward_keys` names in
    `non_tensor_batch` (what a reward function returns besides "score"), placed on each response's last token;
    without config and batches, the token-level rewards are the one component. Returns (advantages, advantages).
    The trainer hands it the batch's tensors and columns (`ray_trainer.compute_advantage`)."""
    components, weights = [token_level_rewards], None
    if config is not None and non_tensor_batch is not None and batch is not None:
        keys = _cfg(config, "gdpo_reward_keys", None)
        if not keys:
            raise ValueError("GDPO needs algorithm.gdpo_reward_keys: the reward components your compute_score "
                             "returns in its dict (e.g. ['format_reward', 'accuracy_reward'])")
        last = (batch["attention_mask"][:, batch["prompts"].size(1):].sum(-1) - 1).long()
        rows = torch.arange(len(last), device=token_level_rewards.device)
        components = []
        for key in keys:
            if key not in non_tensor_batch:
                raise KeyError(f"GDPO reward key {key!r} is not a batch column (have {sorted(non_tensor_batch)}); "
                               f"return it from compute_score's dict")
            scores = torch.zeros_like(response_mask, dtype=torch.float32)
            scores[rows, last] = torch.as_tensor(np.asarray(non_tensor_batch[key], dtype=np.float32),
                                                 device=scores.device)
            components.append(scores)
        weights = _cfg(config, "gdpo_reward_weights", None)
    weights = [1.0] * len(components) if weights is None else list(weights)
    if len(weights) != len(components):
        raise ValueError(f"algorithm.gdpo_reward_weights has {len(weights)} entries for {len(components)} keys")
    total = None
    for weight, component in zip(weights, components):
        normalised, _ = compute_grpo_outcome_advantage(component, response_mask, index, epsilon,
                                                       norm_adv_by_std_in_grpo, config)
        total = weight * normalised if total is None else total + weight * normalised
    advantages = verl_F.masked_whiten(total, response_mask) * response_mask
    return advantages, advantages


def compute_optimal_token_baseline_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor,
                                             index: np.ndarray, old_log_probs: torch.Tensor,
                                             sum_pi_squared: torch.Tensor,
                                             rollout_is_weights: torch.Tensor | None = None,
                                             handle_zero_tail: bool = True, epsilon: float = 1e-8,
                                             **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """Optimal Token Baseline: A_t = G_t - B_t with one baseline per prompt group and position,
    B_t = sum_i G_it W_it / sum_i W_it over the group's responses that reach t, where G is the reward-to-go and
    W_t = sum_{j<=t} (1 - 2 pi_j + sum_v pi_v^2) the accumulated squared score norm (times the squared rollout
    importance weight when given). A group of one keeps its returns. With `handle_zero_tail`, the part of a
    single longest response past the second longest gets no baseline.

    Not a registered estimator here: it needs `sum_pi_squared` (sum over the vocabulary of pi^2 per token),
    which this verl's actor does not compute, so `algorithm.adv_estimator=optimal_token_baseline` is refused.
    Returns (advantages, returns)."""
    with torch.no_grad():
        mask = response_mask.to(token_level_rewards.dtype)
        returns = (token_level_rewards * mask).flip(-1).cumsum(-1).flip(-1)
        step = 1 - 2 * torch.exp(old_log_probs) + sum_pi_squared
        if rollout_is_weights is not None:
            step = step * rollout_is_weights.square()
        weight = (step * mask).cumsum(-1) * mask
        baselines = torch.zeros_like(returns)
        groups: dict = {}
        for row, key in enumerate(index):
            groups.setdefault(key, []).append(row)
        for rows in groups.values():
            if len(rows) < 2:
                continue
            rows_t = torch.tensor(rows, device=returns.device)
            w = weight[rows_t]
            baseline = (returns[rows_t] * w).sum(0) / (w.sum(0) + epsilon)
            baselines[rows_t] = baseline.expand(len(rows), -1)
            if handle_zero_tail:
                lengths = mask[rows_t].sum(-1)
                ordered = torch.sort(lengths).values
                longest, runner_up = int(ordered[-1]), int(ordered[-2])
                holders = (lengths == longest).nonzero(as_tuple=True)[0]
                if holders.numel() == 1 and longest > runner_up:
                    baselines[rows[int(holders[0])], runner_up:] = 0.0
        advantages = (returns - baselines) * mask
    return advantages, returns


def compute_rewards(token_level_scores, old_log_prob, ref_log_prob, kl_ratio):
    """Scores minus kl_ratio times the k1 KL estimate, token by token (KL in the reward)."""
    return token_level_scores - (old_log_prob - ref_log_prob) * kl_ratio


# --------------------------------------------------------------------------- loss aggregation


def agg_loss(loss_mat: torch.Tensor, loss_mask: torch.Tensor, loss_agg_mode: str, dp_size: int = 1,
             batch_num_tokens=None, global_batch_size=None, loss_scale_factor=None):
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


def _batch_info(config) -> dict:
    return dict(_cfg(config, "global_batch_info", {}) or {})


def _weighted_loss(per_token, response_mask, loss_agg_mode: str, config, rollout_is_weights):
    """Aggregate a per-token loss, each token first weighted by its rollout importance weight when given,
    with the global denominators the actor put in `config.global_batch_info`."""
    if rollout_is_weights is not None:
        per_token = per_token * rollout_is_weights
    return agg_loss(per_token, response_mask, loss_agg_mode, **_batch_info(config))


def compute_policy_loss(old_log_prob, log_prob, advantages, response_mask, cliprange=None, cliprange_low=None,
                        cliprange_high=None, clip_ratio_c=3.0, loss_agg_mode: str = "token-mean"):
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
def compute_policy_loss_vanilla(old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
                                response_mask: torch.Tensor, loss_agg_mode: str = "token-mean", config=None,
                                rollout_is_weights: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, Any]]:
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
    pg_loss = _weighted_loss(per_token, response_mask, loss_agg_mode, config, rollout_is_weights)
    metrics = {
        "actor/pg_clipfrac": clipfrac.detach(),
        "actor/ppo_kl": ppo_kl.detach(),
        "actor/pg_clipfrac_lower": clipfrac_lower.detach(),
    }
    return pg_loss, metrics


def compute_entropy_loss(logits, response_mask, loss_agg_mode: str = "token-mean"):
    """Aggregated per-token entropy of the policy (the actor subtracts entropy_coeff times this)."""
    return agg_loss(verl_F.entropy_from_logits(logits), response_mask, loss_agg_mode)


def compute_value_loss(vpreds: torch.Tensor, returns: torch.Tensor, values: torch.Tensor, response_mask: torch.Tensor,
                       cliprange_value: float, loss_agg_mode: str = "token-mean", dp_size: int = 1,
                       batch_num_tokens=None, global_batch_size=None, loss_scale_factor=None):
    """Clipped value loss: 0.5 * max((v - R)^2, (clip(v, v_old +- c) - R)^2), aggregated.

    Returns (vf_loss, vf_clipfrac), the latter the fraction of tokens where the clipped term won.
    """
    vpred_clipped = verl_F.clip_by_value(vpreds, values - cliprange_value, values + cliprange_value)
    loss_unclipped = (vpreds - returns) ** 2
    loss_clipped = (vpred_clipped - returns) ** 2
    vf_loss = 0.5 * agg_loss(torch.maximum(loss_unclipped, loss_clipped), response_mask, loss_agg_mode,
                             dp_size=dp_size, batch_num_tokens=batch_num_tokens, global_batch_size=global_batch_size,
                             loss_scale_factor=loss_scale_factor)
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


# --------------------------------------------------------------------------- more policy losses (upstream names)


def _clip_range(config) -> tuple[float, float]:
    clip_ratio = _cfg(config, "clip_ratio", 0.2)
    return _cfg(config, "clip_ratio_low", clip_ratio), _cfg(config, "clip_ratio_high", clip_ratio)


def _loss_option(config, key: str, default):
    return _cfg(_cfg(config, "policy_loss", {}), key, default)


def _pg_metrics(**values) -> dict[str, float]:
    return {f"actor/{k}": float(v.detach().item() if isinstance(v, torch.Tensor) else v) for k, v in values.items()}


def _need_config(config, name: str) -> None:
    if config is None:
        raise ValueError(f"{name} needs config (the actor config)")


@register_policy_loss("gspo")
def compute_policy_loss_gspo(old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
                             response_mask: torch.Tensor, loss_agg_mode: str = "seq-mean-token-mean", config=None,
                             rollout_is_weights: torch.Tensor | None = None):
    """GSPO (arXiv:2507.18071): PPO clipping on the sequence-level ratio
    s_i = exp(mean_t log(pi/pi_old)), applied to every token of the sequence. Each token's ratio is
    written sg[s_i] * pi_t / sg[pi_t], so its value is s_i and its gradient flows through the token's
    own log-prob (the paper's token-level GSPO-token form). Upstream recommends
    loss_agg_mode=seq-mean-token-mean."""
    _need_config(config, "compute_policy_loss_gspo")
    clip_low, clip_high = _clip_range(config)
    log_ratio = log_prob - old_log_prob
    lengths = response_mask.sum(dim=-1).clamp(min=1)
    seq_log_ratio = (log_ratio * response_mask).sum(dim=-1) / lengths
    token_log_ratio = torch.clamp(log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1), max=10.0)
    ratio = torch.exp(token_log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    per_token = torch.maximum(unclipped, clipped)
    pg_loss = _weighted_loss(per_token, response_mask, loss_agg_mode, config, rollout_is_weights)
    return pg_loss, _pg_metrics(pg_clipfrac=verl_F.masked_mean((clipped > unclipped).float(), response_mask),
                                ppo_kl=verl_F.masked_mean(-log_ratio, response_mask), pg_clipfrac_lower=0.0)


@register_policy_loss("sapo")
def compute_policy_loss_sapo(old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
                             response_mask: torch.Tensor, loss_agg_mode: str = "seq-mean-token-mean", config=None,
                             rollout_is_weights: torch.Tensor | None = None):
    """SAPO (arXiv:2511.20347): a smooth gate instead of a hard clip. Per token,
    loss = -A * (4/tau) * sigmoid(tau * (r - 1)) with tau = actor.tau_pos where A > 0 and
    actor.tau_neg elsewhere; at r = 1 the gradient equals PPO's and it fades as r leaves 1.
    As upstream, the loss is always aggregated seq-mean-token-mean (loss_agg_mode is not used)."""
    _need_config(config, "compute_policy_loss_sapo")
    tau_pos, tau_neg = (torch.tensor(float(_cfg(config, key, default)), dtype=advantages.dtype, device=advantages.device)
                        for key, default in (("tau_pos", 1.0), ("tau_neg", 1.05)))
    tau = torch.where(advantages > 0, tau_pos, tau_neg)
    log_ratio = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    gate = torch.sigmoid(tau * (torch.exp(log_ratio) - 1.0)) * (4.0 / tau)
    per_token = -gate * advantages
    pg_loss = _weighted_loss(per_token, response_mask, "seq-mean-token-mean", config, rollout_is_weights)
    return pg_loss, _pg_metrics(pg_clipfrac=0.0, ppo_kl=verl_F.masked_mean(-log_ratio, response_mask),
                                pg_clipfrac_lower=0.0)


@register_policy_loss("gpg")
def compute_policy_loss_gpg(old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
                            response_mask: torch.Tensor, loss_agg_mode: str = "token-mean", config=None,
                            rollout_is_weights: torch.Tensor | None = None):
    """GPG (arXiv:2504.02546): the plain policy gradient -A * log pi, no ratio and no clipping."""
    _need_config(config, "compute_policy_loss_gpg")
    per_token = -log_prob * advantages
    return _weighted_loss(per_token, response_mask, loss_agg_mode, config, rollout_is_weights), {}


def _covariance(advantages, log_prob, response_mask):
    """Per-token centred product (A - mean A)(log pi - mean log pi) over the valid tokens
    (arXiv:2505.22617), the term whose large values drive entropy collapse."""
    return ((advantages - verl_F.masked_mean(advantages, response_mask))
            * (log_prob.detach() - verl_F.masked_mean(log_prob.detach(), response_mask)))


@register_policy_loss("clip_cov")
def compute_policy_loss_clip_cov(old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
                                 response_mask: torch.Tensor, loss_agg_mode: str = "token-mean", config=None,
                                 rollout_is_weights: torch.Tensor | None = None):
    """Clip-Cov (arXiv:2505.22617): PPO's clipped loss, with the gradient removed from a random
    `policy_loss.clip_cov_ratio` share of the valid tokens (at least one) whose covariance lies in
    (clip_cov_lb, clip_cov_ub) and that PPO's clip has not already cut."""
    _need_config(config, "compute_policy_loss_clip_cov")
    ratio_share = float(_loss_option(config, "clip_cov_ratio", 0.0002))
    lower, upper = float(_loss_option(config, "clip_cov_lb", 1.0)), float(_loss_option(config, "clip_cov_ub", 5.0))
    if ratio_share <= 0:
        raise ValueError(f"actor.policy_loss.clip_cov_ratio must be > 0, got {ratio_share}")
    clip_low, clip_high = _clip_range(config)
    log_ratio = log_prob - old_log_prob
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    valid = response_mask > 0
    cov = _covariance(advantages, log_prob, response_mask)
    candidates = torch.nonzero(valid & ~(clipped > unclipped) & (cov > lower) & (cov < upper))
    n_cut = max(int(ratio_share * int(valid.sum())), 1)
    chosen = candidates[torch.randperm(len(candidates), device=candidates.device)[:n_cut]]
    keep = torch.ones_like(advantages)
    keep[chosen[:, 0], chosen[:, 1]] = 0
    per_token = torch.maximum(unclipped, clipped) * keep
    pg_loss = _weighted_loss(per_token, response_mask, loss_agg_mode, config, rollout_is_weights)
    return pg_loss, _pg_metrics(pg_clipfrac=verl_F.masked_mean((keep == 0).float(), response_mask),
                                ppo_kl=verl_F.masked_mean(-log_ratio, response_mask))


@register_policy_loss("kl_cov")
def compute_policy_loss_kl_cov(old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
                               response_mask: torch.Tensor, loss_agg_mode: str = "token-mean", config=None,
                               rollout_is_weights: torch.Tensor | None = None):
    """KL-Cov (arXiv:2505.22617): the unclipped loss -A * r, plus policy_loss.ppo_kl_coef * |log r| on
    the `policy_loss.kl_cov_ratio` share of valid tokens (at least one) with the largest covariance."""
    _need_config(config, "compute_policy_loss_kl_cov")
    share = float(_loss_option(config, "kl_cov_ratio", 0.0002))
    coef = float(_loss_option(config, "ppo_kl_coef", 1.0))
    if share <= 0:
        raise ValueError(f"actor.policy_loss.kl_cov_ratio must be > 0, got {share}")
    log_ratio = log_prob - old_log_prob
    per_token = -advantages * torch.exp(log_ratio)
    valid = response_mask > 0
    flat_valid = torch.nonzero(valid.flatten()).flatten()
    if flat_valid.numel():
        cov = _covariance(advantages, log_prob, response_mask).flatten()[flat_valid]
        top = flat_valid[torch.topk(cov, max(1, int(flat_valid.numel() * share))).indices]
        penalty = torch.zeros(per_token.numel(), dtype=per_token.dtype, device=per_token.device)
        penalty[top] = 1.0
        per_token = per_token + coef * log_ratio.abs() * penalty.view_as(per_token)
    pg_loss = _weighted_loss(per_token, response_mask, loss_agg_mode, config, rollout_is_weights)
    return pg_loss, _pg_metrics(ppo_kl=verl_F.masked_mean(log_ratio.abs(), response_mask))


@register_policy_loss("geo_mean")
def compute_policy_loss_geo_mean(old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
                                 response_mask: torch.Tensor, loss_agg_mode: str = "token-mean", config=None,
                                 rollout_is_weights: torch.Tensor | None = None):
    """GMPO (arXiv:2507.20673): the sequence ratio is the geometric mean of token ratios, each token's
    log-ratio first clipped to [-clip_ratio_low, clip_ratio_high] on the side the advantage's sign
    makes pessimistic; loss_i = -mean_t(A) * exp(mean_t(clipped log r)), averaged over sequences
    (loss_agg_mode is not used, as upstream; with data parallelism the global sequence count divides)."""
    _need_config(config, "compute_policy_loss_geo_mean")
    clip_low, clip_high = _clip_range(config)
    log_ratio = log_prob - old_log_prob
    sign = torch.sign(advantages)
    bounded = torch.clamp(log_ratio, -clip_low, clip_high)
    pessimistic = sign * torch.minimum(sign * log_ratio, sign * bounded)
    lengths = response_mask.sum(dim=-1)
    seq_ratio = torch.exp((pessimistic * response_mask).sum(dim=-1) / (lengths + 1e-8))
    seq_adv = (advantages * response_mask).sum(dim=-1) / (lengths + 1e-8)
    per_seq = -seq_adv * seq_ratio
    if rollout_is_weights is not None:
        per_seq = per_seq * torch.exp((torch.log(rollout_is_weights + 1e-10) * response_mask).sum(dim=-1)
                                      / (lengths + 1e-8))
    info = _batch_info(config)
    pg_loss = per_seq.sum() / info["global_batch_size"] * info.get("dp_size", 1) \
        if info.get("global_batch_size") else per_seq.mean()
    cut = (log_ratio != bounded).float()
    return pg_loss, _pg_metrics(pg_clipfrac=verl_F.masked_mean(cut * (advantages > 0), response_mask),
                                ppo_kl=verl_F.masked_mean(-log_ratio, response_mask),
                                pg_clipfrac_lower=verl_F.masked_mean(cut * (advantages < 0), response_mask))


@register_policy_loss("cispo")
def compute_policy_loss_cispo(old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
                              response_mask: torch.Tensor, loss_agg_mode: str = "token-mean", config=None,
                              rollout_is_weights: torch.Tensor | None = None):
    """CISPO (MiniMax-M1, arXiv:2506.13585): -sg[clip(r, 1-low, 1+high)] * A * log pi. The importance
    weight is clipped and detached, so no token's gradient is dropped (PPO's clip zeroes it)."""
    _need_config(config, "compute_policy_loss_cispo")
    clip_low, clip_high = _clip_range(config)
    log_ratio = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(log_ratio)
    weight = torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    per_token = -weight.detach() * advantages * log_prob
    pg_loss = _weighted_loss(per_token, response_mask, loss_agg_mode, config, rollout_is_weights)
    return pg_loss, _pg_metrics(pg_clipfrac=verl_F.masked_mean((ratio != weight).float(), response_mask),
                                ppo_kl=verl_F.masked_mean(-log_ratio, response_mask), pg_clipfrac_lower=0.0)


def _dppo_loss(trust_region, old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
               rollout_is_weights) -> tuple[torch.Tensor, dict]:
    """DPPO's shared objective: -A * sg[min(r, clip_ratio_c)] * log pi on the tokens inside the trust region
    (one on the token's probability, not on the ratio). `trust_region(log_prob, old_log_prob, advantages, low,
    high)` marks those tokens, given clip_ratio_low and clip_ratio_high."""
    _need_config(config, "DPPO")
    keep = trust_region(log_prob, old_log_prob, advantages, *_clip_range(config)).detach().float()
    log_ratio = torch.clamp(log_prob - old_log_prob, min=-20.0, max=20.0)
    ratio = torch.exp(log_ratio)
    cap = _cfg(config, "clip_ratio_c", 20.0)
    per_token = -advantages * torch.clamp(ratio, max=cap).detach() * log_prob * keep
    pg_loss = _weighted_loss(per_token, response_mask, loss_agg_mode, config, rollout_is_weights)
    return pg_loss, _pg_metrics(pg_clipfrac=verl_F.masked_mean(1.0 - keep, response_mask),
                                ppo_kl=verl_F.masked_mean(-log_ratio, response_mask),
                                pg_clipfrac_lower=verl_F.masked_mean((ratio > cap).float() * keep, response_mask))


def _total_variation_region(log_prob, old_log_prob, advantages, low, high):
    moved = torch.exp(log_prob) - torch.exp(old_log_prob)
    return torch.where(advantages > 0, moved <= high, moved >= -low)


def _binary_kl_region(log_prob, old_log_prob, advantages, low, high):
    p, p_old = torch.exp(log_prob), torch.exp(old_log_prob)
    eps = 1e-8
    binary_kl = p_old * (old_log_prob - log_prob) + (1 - p_old) * torch.log((1 - p_old + eps) / (1 - p + eps))
    return torch.where(advantages > 0, (binary_kl <= high) | (p <= p_old), (binary_kl <= low) | (p >= p_old))


@register_policy_loss("dppo_tv")
def compute_policy_loss_dppo_tv(old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
                                response_mask: torch.Tensor, loss_agg_mode: str = "token-mean", config=None,
                                rollout_is_weights: torch.Tensor | None = None):
    """DPPO-Binary-TV (arXiv:2602.04879): a token keeps its gradient while its probability moved by at most
    clip_ratio_high up (positive advantage) or clip_ratio_low down (negative advantage)."""
    return _dppo_loss(_total_variation_region, old_log_prob, log_prob, advantages, response_mask, loss_agg_mode,
                      config, rollout_is_weights)


@register_policy_loss("dppo_kl")
def compute_policy_loss_dppo_kl(old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
                                response_mask: torch.Tensor, loss_agg_mode: str = "token-mean", config=None,
                                rollout_is_weights: torch.Tensor | None = None):
    """DPPO-Binary-KL (arXiv:2602.04879): the KL between the old and new Bernoulli(token probability) must stay
    within clip_ratio_high (for a probability moving up under a positive advantage) or clip_ratio_low (moving
    down under a negative one); moves the other way are always kept."""
    return _dppo_loss(_binary_kl_region, old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config,
                      rollout_is_weights)


@register_policy_loss("dro")
def compute_policy_loss_dro(old_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
                            response_mask: torch.Tensor, loss_agg_mode: str = "token-mean", config=None,
                            rollout_is_weights: torch.Tensor | None = None):
    """Direct Reward Optimization: -(A * log pi - beta/2 * (log pi - log pi_old)^2), beta =
    policy_loss.dro_beta (> 0)."""
    _need_config(config, "compute_policy_loss_dro")
    beta = _loss_option(config, "dro_beta", None)
    if beta is None or beta <= 0:
        raise ValueError("actor_rollout_ref.actor.policy_loss.dro_beta must be a positive value when using DRO")
    log_ratio = log_prob - old_log_prob
    per_token = -(log_prob * advantages - 0.5 * beta * log_ratio.square())
    pg_loss = _weighted_loss(per_token, response_mask, loss_agg_mode, config, rollout_is_weights)
    return pg_loss, _pg_metrics(ppo_kl=verl_F.masked_mean(-log_ratio, response_mask))


def compute_policy_loss_reinforce(rollout_log_prob: torch.Tensor, log_prob: torch.Tensor, advantages: torch.Tensor,
                                  response_mask: torch.Tensor, loss_agg_mode: str = "seq-mean-token-sum", config=None,
                                  rollout_is_weights: torch.Tensor | None = None):
    """REINFORCE: -A * log pi (times the rollout importance weights when given), no ratio, no clip.
    `actor/ppo_kl` is the mean of log pi_rollout - log pi. Not a registered loss mode, as upstream."""
    _need_config(config, "compute_policy_loss_reinforce")
    per_token = -advantages * log_prob
    pg_loss = _weighted_loss(per_token, response_mask, loss_agg_mode, config, rollout_is_weights)
    return pg_loss, _pg_metrics(ppo_kl=verl_F.masked_mean(rollout_log_prob - log_prob, response_mask))
