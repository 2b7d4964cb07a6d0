"""The output folder's run lock: a live holder keeps a second run out (the message names both the folder
and the holder); a lock left by a run that died (kill -9) is taken over with a warning; release removes it."""
import json
import os
import signal
import socket
import subprocess
import sys

import pytest

from verl.utils.checkpoint.run_lock import LOCK_FILE, RunLock, RunLockError

HOLD = """
import sys, time
from verl.utils.checkpoint.run_lock import RunLock
RunLock(sys.argv[1]).acquire()
print("held", flush=True)
time.sleep(60)
"""


def _holder(folder):
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(folder)], stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_live_run_in_another_process_keeps_the_folder(tmp_path):
    proc = _holder(tmp_path)
    try:
        with pytest.raises(RunLockError, match=rf"another run is using the output folder {tmp_path}: pid {proc.pid} "
                                               rf"on host {socket.gethostname()}, started \d{{4}}-"):
            RunLock(str(tmp_path)).acquire()
    finally:
        proc.kill()
        proc.wait()


def test_a_lock_left_by_a_killed_run_is_taken_over_with_a_warning(tmp_path, capsys):
    proc = _holder(tmp_path)
    os.kill(proc.pid, signal.SIGKILL)             # dies without releasing: the file stays, the flock goes
    proc.wait()
    assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == proc.pid
    lock = RunLock(str(tmp_path)).acquire()
    assert f"taking over {tmp_path / LOCK_FILE}, left by a run that is no longer alive (pid {proc.pid}" \
        in capsys.readouterr().out
    assert json.loads((tmp_path / LOCK_FILE).read_text())["pid"] == os.getpid()
    lock.release()
    assert not (tmp_path / LOCK_FILE).exists()


def test_release_lets_the_next_run_in_and_a_folder_the_lock_made_goes_with_it(tmp_path, capsys):
    folder = tmp_path / "checkpoints" / "run"
    with RunLock(str(folder)):
        with pytest.raises(RunLockError):
            RunLock(str(folder)).acquire()          # a second lock in the same process is refused too
    assert not (tmp_path / "checkpoints").exists()  # nothing was written there: the folders the lock made go
    with RunLock(str(folder)):
        pass
    assert "taking over" not in capsys.readouterr().out
