"""benchmarks/gpu_matrix.py off the GPU: its overrides are the stock command's keys and plan on every
profile, and it reads the training and validation peaks apart from a run's JSON lines."""
import argparse
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("gpu_matrix", ROOT / "benchmarks" / "gpu_matrix.py")
gm = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gm)

ARGS = argparse.Namespace(assets=".gpu-assets", batch=8, prompt=256, response=128, val=256, test_freq=2, steps=4)


@pytest.mark.parametrize("profile,algo", [("p40", "ppo"), ("t4", "grpo")])
def test_cell_overrides_compose_and_plan(profile, algo):
    """The cell's command passes main_ppo's config checks, and the plan sizes validation for its val set."""
    from verl.compat.__main__ import plan_for

    config, _, plan = plan_for(gm.overrides(ARGS, profile, algo, "/nonexistent"), model_spec="qwen2.5-0.5b")
    assert plan.device.name == profile and plan.device.simulated
    assert (plan.critic is not None) == (algo == "ppo") and (plan.ref is not None) == (algo == "grpo")
    assert config.data.val_batch_size == config.data.val_max_samples == ARGS.val
    assert "validation" in plan.memory["phases_total"]
    assert plan.memory["required_gb"] <= plan.memory_limit_gb


def test_measured_splits_training_and_validation_peaks(tmp_path):
    """The allocator's peak never resets: steps up to test_freq are training only, later ones carry the
    validation run after step test_freq."""
    path = tmp_path / "run.jsonl"
    peaks = [10.0, 10.5, 14.0, 14.0]
    with open(path, "w") as f:
        for step, peak in enumerate(peaks, 1):
            f.write(json.dumps({"step": step, "data": {"timing_s/step": 2.0 + step,
                                                       "perf/max_memory_allocated_gb": peak}}) + "\n")
        f.write(json.dumps({"step": 4, "data": {"val-core/x/reward/mean@1": 0.0}}) + "\n")
    m = gm.measured(path, test_freq=2)
    assert (m["steps"], m["train_gb"], m["with_validation_gb"]) == (4, 10.5, 14.0)
    row = {"profile": "p40", "algo": "ppo", "exit": 0, "measured": m,
           "predicted": {"train_gb": 10.0, "validation_gb": 15.4, "rollout_chunk": 256}}
    line = gm.table([row]).splitlines()[-1]
    assert line.startswith("| p40 | ppo | 0 | 5.00 | 10.00 / 10.50 | -5% | 15.40 / 14.00 | +10% | 256 |")
