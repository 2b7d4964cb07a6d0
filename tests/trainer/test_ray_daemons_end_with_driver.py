"""After kill -9 of a driver that started a local Ray instance, none of that instance's processes (the
dashboard and runtime-env agents included) outlive it by more than a few seconds. Other Ray instances on
the host are left alone."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from verl.trainer.ppo.ray_reaper import session_processes

REPO_ROOT = Path(__file__).resolve().parents[2]
DRIVER = """
import time
import ray
from omegaconf import OmegaConf
from verl.trainer.ppo.task_runner import _init_ray
_init_ray(OmegaConf.create({"trainer": {"n_gpus_per_node": 1, "nnodes": 1},
                            "ray_kwargs": {"ray_init": {"num_cpus": 1}}}))
print("SESSION", ray._private.worker._global_node.get_session_dir_path(), flush=True)
time.sleep(300)
"""
AGENTS = (b"DashboardAgent", b"RuntimeEnvAgent")


def _titles(pids):
    out = []
    for pid in pids:
        try:
            out.append(open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")[0])
        except OSError:
            pass
    return out


def test_kill_9_of_the_driver_ends_the_local_ray_instance(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = str(REPO_ROOT)
    driver = subprocess.Popen([sys.executable, "-c", DRIVER], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              text=True, env=env, cwd=tmp_path)
    try:
        lines = iter(driver.stdout.readline, "")
        session = next((line.split()[1] for line in lines if line.startswith("SESSION ")), None)
        assert session, "the driver did not start Ray"
        deadline = time.monotonic() + 30   # the raylet starts its agents a moment after ray.init returns
        while time.monotonic() < deadline and not all(any(a in t for t in _titles(session_processes(session)))
                                                      for a in AGENTS):
            time.sleep(0.5)
        assert all(any(a in t for t in _titles(session_processes(session))) for a in AGENTS)
    finally:
        os.kill(driver.pid, signal.SIGKILL)
        driver.wait()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and session_processes(session):
        time.sleep(0.5)
    left = session_processes(session)
    assert left == [], f"still running 15 s after the driver died: {_titles(left)}"
