"""SFT resumed from its checkpoint (trainer.resume_mode=auto) continues exactly as an uninterrupted run.

Batches are a seeded function of the step and the checkpoint restores weights, optimizer, LR schedule
and RNG, so steps 3-4 after a stop at step 2 give the uninterrupted run's losses (float32: 1e-5 relative).
"""
import pandas as pd
import pytest
from test_sft_ray import _sft
from test_sft_then_grpo import _rows


def test_resume_continues_like_an_uninterrupted_run(copy_task, tmp_path):
    model = copy_task[0]
    pd.DataFrame({"messages": _rows(16)}).to_parquet(tmp_path / "train.parquet")
    straight, _ = _sft("verl.trainer.sft_trainer", model, tmp_path, "straight", 1, steps=4)
    first, _ = _sft("verl.trainer.sft_trainer", model, tmp_path, "resumed", 1, steps=2)
    assert sorted(first) == [1, 2]
    resumed, stdout = _sft("verl.trainer.sft_trainer", model, tmp_path, "resumed", 1, steps=4)
    assert f"Resumed from {tmp_path / 'resumed' / 'global_step_2'}" in stdout
    assert sorted(resumed) == [1, 2, 3, 4]   # the file logger appends: steps 3 and 4 are the second run's
    assert "step:1 -" not in stdout and "step:3 -" in stdout
    for step in (3, 4):
        assert resumed[step]["train/loss"] == pytest.approx(straight[step]["train/loss"], rel=1e-5)
        assert resumed[step]["train/lr"] == straight[step]["train/lr"]
