"""benchmarks/summarize_run.py on a file logger's JSON lines: skipped updates are counted and shown."""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from summarize_run import summarize  # noqa: E402


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
