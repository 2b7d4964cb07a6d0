"""Run the stock `python -m verl.trainer.main_ppo` once, watching its file-logger JSONL for the first step.

Shared by the benchmarks that time whole runs (`speed.py`, `cold_start.py`): one process, its log, its
JSONL, a hard timeout, and the cold start (launch to the first step's record in the JSONL).
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def launch_main_ppo(overrides: list[str], jsonl: Path, log: Path, timeout: float) -> dict:
    """{exit, wall_s, cold_start_to_first_step_s, command}; the run's records land in `jsonl`."""
    jsonl.unlink(missing_ok=True)
    env = {**os.environ, "VERL_FILE_LOGGER_PATH": str(jsonl), "PYTHONUNBUFFERED": "1",
           "TOKENIZERS_PARALLELISM": "false", "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}"}
    cmd = [sys.executable, "-m", "verl.trainer.main_ppo", *overrides]

    def first_step_logged() -> bool:
        return jsonl.exists() and '"timing_s/step"' in jsonl.read_text()

    start = time.perf_counter()
    cold = None
    with open(log, "w") as fp:
        proc = subprocess.Popen(cmd, stdout=fp, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
        while proc.poll() is None:
            if cold is None and first_step_logged():
                cold = time.perf_counter() - start
            if time.perf_counter() - start > timeout:
                proc.kill()
                break
            time.sleep(0.1)
        proc.wait()
    wall = time.perf_counter() - start
    if cold is None and first_step_logged():
        cold = wall   # the step landed between the last poll and the exit
    return {"exit": proc.returncode, "wall_s": round(wall, 1), "command": " ".join(cmd[1:]),
            "cold_start_to_first_step_s": None if cold is None else round(cold, 2)}
