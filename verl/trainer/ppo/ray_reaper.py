"""Ends what is left of a local Ray instance once the driver that started it is gone, however it went.

Ray ties its head daemons (GCS, raylet, dashboard, log monitor) to the driver with PDEATHSIG, but the
raylet's own children, the dashboard agent and the runtime-env agent, are handed to init when the
raylet dies and keep running well after a driver killed with -9 (they poll for the raylet, then try to
report its death to a GCS that is gone). `start(session_dir)` launches this file as a small detached
process that holds the read end of a pipe whose write end only the driver has: the pipe closes when the
driver exits or dies, and the reaper then stops every Ray process of this user (other than the driver)
that has a file open under the session folder or names it on its command line, SIGTERM first and
SIGKILL after a grace period. Other Ray instances on the host are never touched. Standard library only,
run by path, so it starts in milliseconds.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

GRACE_S = 3.0


def start(session_dir: str):
    """Launch the reaper for `session_dir`; returns the pipe's write end (a file): close it to make the
    reaper sweep now (after ray.shutdown), or let the driver's exit close it."""
    launcher = subprocess.Popen([sys.executable, "-S", os.path.abspath(__file__), session_dir, str(os.getpid())],
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)   # a Ctrl-C to the driver's process group spares it
    pipe = launcher.stdin
    launcher.stdin = None  # kept open by us; the launcher itself exits at once (its child is the reaper)
    launcher.wait()
    return pipe


def session_processes(session_dir: str, spare: tuple[int, ...] = ()) -> list[int]:
    """Pids of this user's Ray processes (not this one, not `spare`) that name `session_dir` or hold a file in it."""
    mine, skip = os.getuid(), {os.getpid(), *spare}
    prefix = os.path.realpath(session_dir).rstrip("/") + "/"
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) in skip:
            continue
        base = f"/proc/{name}"
        try:
            if os.stat(base).st_uid != mine:
                continue
            with open(f"{base}/cmdline", "rb") as f:
                cmdline = f.read()
            if b"ray" not in cmdline:
                continue
            if session_dir.encode() in cmdline:
                found.append(int(name))
                continue
            for fd in os.listdir(f"{base}/fd"):
                if os.readlink(f"{base}/fd/{fd}").startswith(prefix):
                    found.append(int(name))
                    break
        except OSError:
            continue  # gone meanwhile, or not ours to inspect
    return found


def sweep(session_dir: str, spare: tuple[int, ...] = (), grace_s: float = GRACE_S) -> list[int]:
    """SIGTERM the session's processes, SIGKILL those still there after `grace_s`; returns the pids hit."""
    pids = session_processes(session_dir, spare)
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    for pid in pids:
        if _alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
    return pids


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _main(session_dir: str, driver: int) -> None:
    if os.fork() > 0:  # the launcher returns at once; the reaper is nobody's child to wait for
        os._exit(0)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while sys.stdin.buffer.read(65536):
        pass  # nothing is ever written: this returns at EOF, when the driver is gone or let go
    sweep(session_dir, spare=(driver,))


if __name__ == "__main__":
    _main(sys.argv[1], int(sys.argv[2]))
