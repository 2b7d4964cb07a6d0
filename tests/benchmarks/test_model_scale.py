"""benchmarks/model_scale.py's parts that need no GPU: cells, the tolerance rule, the planner's side of a cell."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import model_scale  # noqa: E402


def test_cells_parse_and_bad_ones_are_refused():
    assert model_scale.parse_cells("p40:7b:lora,t4:1.5b:full") == [("p40", "7b", "lora"), ("t4", "1.5b", "full")]
    assert len(model_scale.parse_cells("goals")) == len(model_scale.GOALS)
    with pytest.raises(SystemExit, match="profile:shape:mode"):
        model_scale.parse_cells("p40:7b:dora")


def test_tolerance_is_plus_15_and_minus_3_percent():
    plan = {"phases": {"actor_update": 11.5, "rollout": 9.6, "log_prob": 12.0}}
    run = {"peaks": {"update_actor": 10.0, "gen": 10.0, "old_log_prob": 10.0, "values": 3.0}}
    verdict = model_scale.judge(plan, run)
    assert verdict["update_actor"]["ok"] and not verdict["gen"]["ok"] and not verdict["old_log_prob"]["ok"]
    assert set(verdict) == {"update_actor", "gen", "old_log_prob"}      # phases on both sides only


def test_measured_reads_the_file_logger(tmp_path):
    import json

    rows = [{"step": s, "data": {"timing_s/step": 2.0 + s, "timing_s/update_actor": 1.0,
                                 "perf/max_memory_allocated_gb/update_actor": 5.0 + s}} for s in (1, 2, 3)]
    path = tmp_path / "run.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = model_scale.measured(path)
    assert got["steps"] == 3 and got["peaks"] == {"update_actor": 8.0} and got["s_per_step"] == 4.5
