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


def test_s_per_step_counts_compiled_steps_only(tmp_path):
    """Under background compile warm-up the first steps run eager code (perf/compiled_layers 0): s/step is the
    median over the compiled steps, the eager ones are counted and timed apart."""
    run = _log(tmp_path / "run.jsonl", [{"perf/compiled_layers": 0.0}, {"perf/compiled_layers": 0.0},
                                        {"perf/compiled_layers": 1.0}, {"perf/compiled_layers": 1.0},
                                        {"perf/compiled_layers": 1.0}])   # timing_s/step 1, 2, 3, 4, 5
    s = summarize(run)
    assert (s["s_per_step"], s["eager_steps"], s["eager_s_per_step"], s["first_step_s"]) == (4.0, 2, 1.5, 1.0)
    plain = summarize(_log(tmp_path / "plain.jsonl", [{}, {}, {}]))   # nothing compiled beside: steps 2+
    assert (plain["s_per_step"], plain["eager_steps"], plain["first_step_compile_s"]) == (2.5, 0, None)
    compiling = summarize(_log(tmp_path / "sync.jsonl", [{"perf/compile_s": 0.75}, {"perf/compile_s": 0.0}]))
    assert compiling["first_step_compile_s"] == 0.75   # the first step's compile seconds, as the trainer logged them


def test_the_first_step_carries_the_startup_breakdown_and_mfu_is_a_median(tmp_path):
    run = _log(tmp_path / "run.jsonl", [{"timing_s/startup": 20.0, "timing_s/startup/ray_init": 3.5,
                                         "perf/mfu/actor": 0.1},
                                        {"perf/mfu/actor": 0.3}, {"perf/mfu/actor": 0.4}, {"perf/mfu/actor": 0.2}])
    s = summarize(run)
    assert s["startup_s"] == {"total": 20.0, "ray_init": 3.5}
    assert s["mfu"] == {"actor": 0.3, "critic": None}     # steps 2+ only


def test_speed_repeats_a_row_and_reports_median_cold_start_and_stages(monkeypatch, tmp_path):
    """`speed.py --repeat`: the cold start and each start-up stage are medians over the runs that logged a step;
    a run that logged none still shows in the exits."""
    import argparse

    import speed

    runs = iter([{"exit": 0, "cold_start_to_first_step_s": 30.0, "startup_s": {"total": 28.0, "ray_init": 9.0}},
                 {"exit": 0, "cold_start_to_first_step_s": 14.0, "startup_s": {"total": 12.0, "ray_init": 3.0}},
                 {"exit": 1, "cold_start_to_first_step_s": None},
                 {"exit": 0, "cold_start_to_first_step_s": 16.0, "startup_s": {"total": 13.0, "ray_init": 4.0}}])
    monkeypatch.setattr(speed, "run_row", lambda *a: dict(next(runs)))
    args = argparse.Namespace(repeat=4, steps=1, timeout=10, extra=[])
    row = speed.repeated("p40", args, tmp_path, gpu=False)
    assert row["exits"] == [0, 0, 1, 0] and row["name"] == "p40"
    assert row["cold_start_to_first_step_s"] == 16.0 and row["startup_s"] == {"total": 13.0, "ray_init": 4.0}
    assert "| ray_init | 4.0 |" in speed.table({"p40": row})
