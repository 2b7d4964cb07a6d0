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
    assert line.startswith("| p40 | ppo | 0 | 5.00 | 10.00 / 10.50 | -4.8% | 15.40 / 14.00 | +10.0% | 256 |")


def test_phase_peaks_compare_each_worker_call_with_its_planned_phase(tmp_path):
    """Each worker call's own peak (perf/max_memory_allocated_gb/<phase>) is set beside the plan's
    phase of the same work: update_actor with actor_update, validation with validation."""
    path = tmp_path / "run.jsonl"
    with open(path, "w") as f:
        for step, (upd, val) in enumerate([(9.0, None), (9.5, 12.0), (9.2, 12.5)], 1):
            data = {"timing_s/step": 3.0, "perf/max_memory_allocated_gb": 12.5,
                    "perf/max_memory_allocated_gb/update_actor": upd}
            if val is not None:
                data["perf/max_memory_allocated_gb/validation"] = val
            f.write(json.dumps({"step": step, "data": data}) + "\n")
    m = gm.measured(path, test_freq=2)
    assert m["phases_gb"] == {"update_actor": 9.5, "validation": 12.5}
    row = {"profile": "t4", "algo": "grpo", "exit": 0, "measured": m,
           "predicted": {"phases_gb": {"actor_update": 10.45, "validation": 11.0, "ref": 6.0}}}
    line = gm.phase_table([row]).splitlines()[-1]
    cells = dict(zip(gm.PHASES, [c.strip() for c in line.strip("|").split("|")[2:]]))
    assert cells["update_actor"] == "10.45 / 9.5 (+10.0%)"
    assert cells["validation"] == "11.0 / 12.5 (-12.0%)"
    assert cells["ref"] == "6.0 / - (-)" and cells["values"] == "-"
