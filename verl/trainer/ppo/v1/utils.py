"""Upstream's `verl.trainer.ppo.v1.utils`. The v1 (transfer-queue) trainers are not supported by this verl; the
advantage helpers work on a DataProto and are real. Any other name raises NotImplementedError."""
from __future__ import annotations

from typing import Any

import torch

from verl._unsupported import stand_in
from verl.protocol import DataProto
from verl.trainer.ppo import core_algos
from verl.trainer.ppo.ray_trainer import compute_advantage

__all__ = ["compute_advantage", "compute_advantage_for_multi_trajectories"]

__getattr__ = stand_in(__name__, "the v1 (transfer-queue) PPO trainers")


def compute_advantage_for_multi_trajectories(
    data: DataProto,
    batch_keys: list[str],
    adv_estimator,
    gamma: float = 1.0,
    lam: float = 1.0,
    num_repeat: int = 1,
    norm_adv_by_std_in_grpo: bool = True,
    config: Any = None,
) -> DataProto:
    """Advantages when one agent-loop sample yields several output rows (sessions).

    `batch_keys[i]` names row i as `{uid}_{session}_{index}`. With GRPO, only the highest-index row of each
    `{uid}_{session}` enters the group statistics (so every sample counts once per prompt), and its scalar
    advantage is spread over that session's rows, masked by each row's response_mask; returns = advantages.
    Other estimators run on all rows as `compute_advantage` does.
    """
    kwargs = dict(gamma=gamma, lam=lam, num_repeat=num_repeat, norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo,
                  config=config)
    if adv_estimator != core_algos.AdvantageEstimator.GRPO:
        return compute_advantage(data, adv_estimator=adv_estimator, **kwargs)
    if len(batch_keys) != len(data):
        raise ValueError(f"batch_keys has {len(batch_keys)} entries for {len(data)} rows")

    last: dict[str, tuple[int, int]] = {}  # session -> (index, row) of its final output
    sessions = []
    for row, key in enumerate(batch_keys):
        parts = key.rsplit("_", 2)
        if len(parts) != 3 or not parts[2].lstrip("-").isdigit():
            raise ValueError(f"batch key {key!r} is not '<uid>_<session>_<index>'")
        session, index = f"{parts[0]}_{parts[1]}", int(parts[2])
        sessions.append(session)
        if session not in last or last[session][0] < index:
            last[session] = (index, row)

    order = list(last)  # sessions in first-seen order
    final_rows = [last[s][1] for s in order]
    final = compute_advantage(data.select_idxs(final_rows), adv_estimator=adv_estimator, **kwargs)
    # an outcome advantage is one value per row: read it at the row's first response token
    first_token = final.batch["response_mask"].argmax(dim=1)
    per_session = final.batch["advantages"][torch.arange(len(final_rows)), first_token]
    position = {s: i for i, s in enumerate(order)}
    spread = per_session[[position[s] for s in sessions]].unsqueeze(-1) * data.batch["response_mask"]
    data.batch["advantages"] = spread
    data.batch["returns"] = spread
    return data
