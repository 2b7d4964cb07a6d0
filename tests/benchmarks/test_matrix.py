"""benchmarks/matrix.py's parts that need no GPU: cells, the cells' commands against the real planner (in
process and through the doctor with `--plan-only`), the tolerance rule, reading the file logger."""
import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))
import matrix  # noqa: E402
import run  # noqa: E402


def test_cells_parse_and_bad_ones_are_refused():
    assert matrix.parse_cells("p40:7b:lora,t4:1.5b:full:ppo") == [("p40", "7b", "lora", "grpo"),
                                                                  ("t4", "1.5b", "full", "ppo")]
    assert len(matrix.parse_cells("goals")) == len(matrix.GOALS)
    for bad in ("p40:7b:dora", "p40:13b:full", "p40:7b:full:dpo", "p40:7b"):
        with pytest.raises(SystemExit, match="profile:shape:mode"):
            matrix.parse_cells(bad)


def test_the_matrix_suite_covers_every_profile_with_ppo_and_grpo_on_the_matrix_settings():
    steps = run.SUITES["matrix"].values()
    cells = [c for _, tool in steps for c in matrix.parse_cells(tool[tool.index("--cells") + 1])]
    assert sorted(cells) == sorted(matrix.parse_cells("devices"))
    assert all(tool[tool.index("--settings") + 1] == "matrix" for _, tool in steps)


@pytest.mark.parametrize("cell,settings", [(("p40", "0.5b", "full", "ppo"), "matrix"),
                                           (("t4", "1.5b", "lora", "grpo"), "scale")])
def test_cell_overrides_compose_and_plan(cell, settings):
    """The cell's command passes main_ppo's config checks; the plan is for the cell's profile, algorithm, mode
    and validation set."""
    from verl.compat.__main__ import plan_for

    cmd = matrix.overrides(cell, settings, Path(".gpu-assets"), Path("/nonexistent"), steps=3, full_length=False)
    config, _, plan = plan_for(cmd, model_spec=f"qwen2.5-{cell[1]}")
    assert plan.device.name == cell[0] and plan.device.simulated
    assert (plan.critic is not None) == (cell[3] == "ppo")
    assert (plan.ref is not None or plan.ref_in_actor) == (cell[3] == "grpo")     # LoRA: the base is the reference
    assert (plan.actor.lora_rank or 0) == (32 if cell[2] == "lora" else 0)
    assert config.data.val_batch_size == config.data.val_max_samples == matrix.SETTINGS[settings]["val"]
    assert config.trainer.test_freq == (2 if settings == "matrix" else 3)
    assert "validation" in plan.memory["phases"] and plan.memory["required_gb"] <= plan.memory_limit_gb


def test_plan_only_runs_the_planner_per_cell_and_reports_refusals(tmp_path, capsys):
    """`--plan-only`: the doctor's answer per cell (`python -m verl.compat --json`); 7B in full on a T4 is
    refused with the planner's reason, the 0.5B PPO cell gets a plan with every phase the run measures."""
    assert matrix.main(["--cells", "p40:0.5b:full:ppo,t4:7b:full", "--plan-only", "--out", str(tmp_path)]) == 0
    ok, refused = json.loads((tmp_path / "matrix.json").read_text())["cells"]
    assert "does not fit on t4" in refused["plan"]["refused"] and "run" not in refused
    plan = ok["plan"]
    assert set(plan["phases"]) == set(matrix.PHASES.values()) - {"ref"}    # PPO without KL: no reference
    assert plan["simulated"] and plan["required_gb"] <= plan["limit_gb"] and plan["peak_gb"] > 0
    out = capsys.readouterr().out
    assert "| t4:7b:full:grpo | refused: The run does not fit on t4" in out and "| p40:0.5b:full:ppo | " in out


def test_tolerance_is_plus_15_and_minus_3_percent():
    plan = {"phases": {"actor_update": 11.5, "rollout": 9.6, "log_prob": 12.0}}
    run_ = {"peaks": {"update_actor": 10.0, "gen": 10.0, "old_log_prob": 10.0, "values": 3.0}}
    verdict = matrix.judge(plan, run_)
    assert verdict["update_actor"]["ok"] and not verdict["gen"]["ok"] and not verdict["old_log_prob"]["ok"]
    assert set(verdict) == {"update_actor", "gen", "old_log_prob"}      # phases on both sides only
    row = {"cell": "t4:0.5b:full:grpo", "plan": {**plan, "peak_gb": 12.0, "actor": {}}, "phases": verdict,
           "run": {"exit": 0, "s_per_step": 4.5, "run_peak_gb": 10.0}}
    text = matrix.table([row])
    assert "update_actor 11.50/10.00 (+15.0%)" in text and "gen 9.60/10.00 (-4.0%, off)" in text
    assert "| 12.00 / 10.00 |" in text and text.endswith("1 of 3 phases within +15% / -3%")
    assert "host" not in text                      # nothing offloaded: no host-memory prediction
    row["plan"]["host_gb"], row["run"]["memory_gb"] = 28.97, {"perf/cpu_memory_used_gb": 27.8}
    assert "; host 28.97 / 27.80 |" in matrix.table([row])


def test_measured_reads_the_file_logger(tmp_path):
    """Peak per phase and s/step (median after the first) from the file logger; the run's peak before the
    first validation apart from the whole run's (the allocator's peak never resets)."""
    rows = [{"step": s, "data": {"timing_s/step": 2.0 + s, "timing_s/update_actor": 1.0,
                                 "perf/max_memory_allocated_gb": peak,
                                 "perf/max_memory_allocated_gb/update_actor": 5.0 + s}}
            for s, peak in ((1, 10.0), (2, 10.5), (3, 14.0))]
    path = tmp_path / "run.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = matrix.measured(path, test_freq=2)
    assert got["steps"] == 3 and got["peaks"] == {"update_actor": 8.0} and got["s_per_step"] == 4.5
    assert (got["train_gb"], got["run_peak_gb"], got["update_actor_s"]) == (10.5, 14.0, 1.0)
