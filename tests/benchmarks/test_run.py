"""benchmarks/run.py, the one runner: a suite or step it does not have is refused with the valid names, and
every step names a tool of the folder; the VL tool's CPU form runs."""
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import run  # noqa: E402


def test_an_unknown_suite_is_refused_with_the_valid_names():
    with pytest.raises(SystemExit) as err:
        run.main(["final8"])
    message = str(err.value)
    assert "unknown suite 'final8'" in message
    assert all(suite in message for suite in run.SUITES)


def test_an_unknown_step_is_refused_with_the_suite_steps():
    with pytest.raises(SystemExit, match="unknown step.*'matrix'.*pre-ampere, ampere-hopper"):
        run.main(["matrix", "--only", "pre-ampere,p40"])


def test_at_most_five_suites_each_step_a_tool_of_the_folder(capsys, tmp_path):
    assert 1 <= len(run.SUITES) <= 5
    for suite, steps in run.SUITES.items():
        assert all((BENCH / tool[0]).is_file() for _, tool in steps.values()), suite
    assert run.main(["phases", "--only", "memory", "--dry-run", "--out", str(tmp_path)]) == 0
    (line,) = capsys.readouterr().out.strip().splitlines()
    assert line.startswith("memory (290 s): ") and line.endswith(f"--out {tmp_path}/phases/memory")
    assert "memory_model.py --profiles p40,p100" in line


def test_vision_tool_runs_upstreams_geo3k_script_on_cpu(tmp_path):
    """benchmarks/vision.py's CPU form: builds a 2-layer VL model (real vocabulary) and geo3k-shaped data, runs
    the stock script one step and summarises it from the file logger."""
    import json

    import vision

    out = tmp_path / "out"
    code = vision.main(["--tiny", "--profile", "cpu", "--batch", "1", "--response", "4", "--steps", "1", "--rows", "2",
                        "--image-size", "56", "--model", str(tmp_path / "model"), "--data", str(tmp_path / "data"),
                        "--timeout", "120", "--out", str(out)])
    row = json.loads((out / "vision_cpu.json").read_text())
    assert code == 0 and row["exit"] == 0 and row["steps"] == 1
    assert row["timing_s"]["gen"] > 0 and row["timing_s"]["update_actor"] > 0
