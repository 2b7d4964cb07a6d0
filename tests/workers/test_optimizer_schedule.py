"""The workers' optimizer builder: upstream's warm-up keys give the learning rates upstream gives."""
import pytest
import torch
from omegaconf import OmegaConf

from verl.workers.fsdp_workers import _build_optimizer


def _lrs(steps: int, **optim) -> list[float]:
    cfg = OmegaConf.create({"lr": 1.0, "weight_decay": 0.0, "lr_warmup_steps": -1, "lr_warmup_steps_ratio": 0.0,
                            "total_training_steps": 4, "lr_scheduler_type": "constant", "warmup_style": None, **optim})
    optimizer, scheduler = _build_optimizer(torch.nn.Linear(2, 1), cfg)
    out = []
    for _ in range(steps):
        out.append(scheduler.get_last_lr()[0])
        optimizer.step()
        scheduler.step()
    return out


def test_no_warmup_trains_at_the_full_rate_from_the_first_update():
    assert _lrs(3) == pytest.approx([1.0, 1.0, 1.0])
    assert _lrs(3, lr_warmup_steps=0) == pytest.approx([1.0, 1.0, 1.0])


def test_warmup_steps_and_ratio_ramp_linearly_from_zero():
    assert _lrs(4, lr_warmup_steps=2) == pytest.approx([0.0, 0.5, 1.0, 1.0])
    assert _lrs(4, lr_warmup_steps_ratio=0.5) == pytest.approx([0.0, 0.5, 1.0, 1.0])  # 0.5 x 4 total steps


def test_cosine_without_warmup_starts_at_the_full_rate():
    lrs = _lrs(3, lr_scheduler_type="cosine", min_lr_ratio=0.0)
    assert lrs == pytest.approx([1.0, 0.5 * (1 + 0.5 ** 0.5), 0.5])  # cos(0), cos(pi/4), cos(pi/2) over 4 steps
