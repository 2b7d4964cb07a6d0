"""benchmarks/run.py, the one runner: a suite or step it does not have is refused with the valid names, and
every step names a tool of the folder."""
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

