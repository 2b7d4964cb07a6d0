"""The stock command on two GPUs of one node (FSDP over NCCL) trains like the same command on one GPU.

Runs where two CUDA devices are present. Both runs are planned as the simulated P40 (float32 compute, TF32
off), so the only differences are the data-parallel split and NCCL's reduction order: the layouts test's
copy task and settings (greedy, ignore_eos, one mini-batch), compared step by step at relative 1e-3
(GPU kernels pick other reduction orders for other batch sizes, and scatter-adds are not ordered).
"""
from __future__ import annotations

import pytest
import torch
from conftest import run_main_ppo
from test_layouts import ACROSS_LAYOUTS, assert_close, command

pytestmark = [pytest.mark.gpu, pytest.mark.slow,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")]
FLOAT32_PLAN = ["compat.device=p40"]


def test_two_gpus_over_nccl_match_one_gpu(copy_task, tmp_path):
    two, two_steps = run_main_ppo(command(copy_task, 1, 2, 3) + FLOAT32_PLAN, log_path=tmp_path / "two.jsonl")
    assert two.returncode == 0, two.stdout[-3000:]
    assert "Worker processes: 2," in two.stdout
    assert "device cuda, backend cpu:gloo,cuda:nccl" in two.stdout   # the plan's backend, printed with the plan
    one, one_steps = run_main_ppo(command(copy_task, 1, 1, 3) + FLOAT32_PLAN, log_path=tmp_path / "one.jsonl")
    assert one.returncode == 0, one.stdout[-3000:]
    assert "Worker processes: 1," in one.stdout
    assert sorted(two_steps) == sorted(one_steps) == [1, 2, 3]
    assert two_steps[1]["actor/grad_norm"] > 0.1   # the compared updates are real
    for key in ACROSS_LAYOUTS:
        worst = max(abs(two_steps[s][key] - one_steps[s][key]) / max(abs(one_steps[s][key]), 1e-12) for s in (1, 2, 3))
        print(f"{key}: largest relative difference {worst:.2e}")
    assert_close(two_steps, one_steps, (1, 2, 3), ACROSS_LAYOUTS, rel=1e-3)
