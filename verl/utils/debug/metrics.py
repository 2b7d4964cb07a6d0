"""How far the rollout engine's token probabilities are from the actor's, for debugging a mismatch."""
from __future__ import annotations

import torch

__all__ = ["calculate_token_list_diff", "pearson_correlation_coefficient", "calculate_log_prob_diff",
           "calculate_debug_metrics"]


def calculate_token_list_diff(tensor1: torch.Tensor, tensor2: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Per row, how many masked positions hold different tokens (all ones when the shapes disagree)."""
    if tensor1.numel() == 0 or tensor2.numel() == 0:
        return torch.zeros(tensor1.shape[0], dtype=torch.long, device=tensor1.device)
    if not (tensor1.shape == tensor2.shape == mask.shape):
        return torch.ones_like(tensor1)
    differs = (tensor1 != tensor2.to(tensor1.device)) & (mask.to(tensor1.device) == 1)
    return differs.sum(dim=1)


def pearson_correlation_coefficient(tensor1: torch.Tensor, tensor2: torch.Tensor, mask: torch.Tensor) -> float:
    """Pearson correlation of the two tensors over the masked positions (0 when the shapes disagree)."""
    if not (tensor1.shape == tensor2.shape == mask.shape):
        return 0
    pair = torch.stack([tensor1[mask], tensor2[mask]]).double()
    return torch.corrcoef(pair)[0, 1].item()


def calculate_log_prob_diff(log_probs1: torch.Tensor, log_probs2: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """|a - b| at the masked positions, flattened."""
    return (log_probs1 - log_probs2).abs()[mask]


def calculate_debug_metrics(data) -> dict:
    """`training/rollout_probs_diff_{valid,max,mean,std}` and `training/rollout_actor_probs_pearson_corr` from a
    batch holding `rollout_log_probs`, `old_log_probs`, `responses` and a response or attention mask; the
    differences are of probabilities (exp of the log-probs) over response tokens."""
    rollout = data.batch["rollout_log_probs"].float()
    actor = data.batch["old_log_probs"].float()
    if "response_mask" in data.batch.keys():
        mask = data.batch["response_mask"]
    elif "attention_mask" in data.batch.keys():
        mask = data.batch["attention_mask"]
    else:
        mask = torch.ones_like(rollout)
    mask = mask[:, -data.batch["responses"].size(1):].bool()
    if not mask.any():
        nan = float("nan")
        return {"training/rollout_probs_diff_valid": 0, "training/rollout_probs_diff_max": nan,
                "training/rollout_probs_diff_mean": nan, "training/rollout_probs_diff_std": nan,
                "training/rollout_actor_probs_pearson_corr": nan}
    actor_p, rollout_p = actor.exp(), rollout.exp()
    diff = calculate_log_prob_diff(actor_p, rollout_p, mask)
    return {"training/rollout_probs_diff_valid": 1, "training/rollout_probs_diff_max": diff.max().item(),
            "training/rollout_probs_diff_mean": diff.mean().item(), "training/rollout_probs_diff_std": diff.std().item(),
            "training/rollout_actor_probs_pearson_corr": pearson_correlation_coefficient(actor_p, rollout_p, mask)}
