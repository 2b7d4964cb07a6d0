"""benchmarks/harness.py's summary of a file logger's JSON lines: skipped updates are counted and shown."""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from harness import summarize  # noqa: E402


def _log(path: Path, steps: list[dict]) -> str:
    path.write_text("".join(json.dumps({"step": i + 1, "data": {"timing_s/step": 1.0 + i, **s}}) + "\n"
                            for i, s in enumerate(steps)))
    return str(path)


def test_skipped_updates_count_the_steps_with_a_non_finite_grad_norm(tmp_path):
    """The file logger writes a non-finite norm as a string; such a step ran no optimizer step."""
    run = _log(tmp_path / "run.jsonl", [{"actor/grad_norm": "nan", "critic/grad_norm": 3.0},
                                        {"actor/grad_norm": 1.5, "critic/grad_norm": "inf"},
                                        {"actor/grad_norm": "nan"}])
    s = summarize(run)
    assert s["skipped_updates"] == {"actor": 2, "critic": 1}
    assert s["steps"] == 3 and s["s_per_step"] == 2.5   # the median after the first step


def test_the_first_step_carries_the_startup_breakdown_and_mfu_is_a_median(tmp_path):
    run = _log(tmp_path / "run.jsonl", [{"timing_s/startup": 20.0, "timing_s/startup/ray_init": 3.5,
                                         "perf/mfu/actor": 0.1},
                                        {"perf/mfu/actor": 0.3}, {"perf/mfu/actor": 0.4}, {"perf/mfu/actor": 0.2}])
    s = summarize(run)
    assert s["startup_s"] == {"total": 20.0, "ray_init": 3.5}
    assert s["mfu"] == {"actor": 0.3, "critic": None}     # steps 2+ only
