"""The start-up clock: consecutive stages add up to the total, overlapped and worker pieces are shown
but not added, and the origin is the process's real start (interpreter and imports included)."""
import subprocess
import sys
import time

import pytest

from verl.utils.startup import clock as startup
from verl.utils.startup.clock import METRIC, Laps, StartupClock


def test_stages_add_up_and_side_pieces_are_not_added():
    clock = StartupClock(origin=time.time() - 2.0)   # a process started two seconds ago
    first = clock.mark("config")
    time.sleep(0.05)
    second = clock.mark("ray_init")
    clock.record("datasets", 1.5)                    # on a thread, during the stages above
    clock.detail("critic/critic_load", 0.7)          # inside a worker
    clock.mark("ray_init")                           # a stage met twice is summed in the metrics
    metrics = clock.metrics()
    assert first >= 2.0 and second >= 0.05
    assert metrics[METRIC] == pytest.approx(sum(s for _, s in clock.stages))
    assert metrics[METRIC] == pytest.approx(time.time() - clock.origin, abs=0.05)
    assert metrics[f"{METRIC}/datasets"] == 1.5 and metrics[f"{METRIC}/critic/critic_load"] == 0.7
    assert metrics[f"{METRIC}/ray_init"] == pytest.approx(clock.stages[1][1] + clock.stages[2][1])
    table = clock.table()
    assert table.splitlines()[0].startswith(f"verl start-up: {clock.total:.1f} s")
    assert "datasets" in table and "overlapped" in table and "inside init_models" in table


def test_process_start_includes_time_before_the_first_import():
    code = ("import time; time.sleep(0.6); from verl.utils.startup.clock import process_start_time; "
            "print(time.time() - process_start_time())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    age = float(out.stdout.strip())
    assert 0.6 <= age < 30


def test_laps_restart_skips_waiting_and_a_later_run_counts_from_itself(monkeypatch):
    laps = Laps(from_process_start=True)
    assert laps.seconds["process_start"] > 0
    time.sleep(0.1)
    laps.restart()                                   # the wait for the driver is not a lap
    laps("load")
    assert laps.seconds["load"] < 0.1
    monkeypatch.setattr(startup, "_CLOCK", None)
    monkeypatch.setattr(startup, "_ENDED", False)
    assert startup.startup_clock().origin == pytest.approx(startup.process_start_time(), abs=0.05)
    startup.end_startup()
    assert startup.startup_clock().origin == pytest.approx(time.time(), abs=0.05)
