"""One run per output folder: a lock file in `trainer.default_local_dir` naming the run that holds it.

Two runs in one folder would each resume from, save over and prune the other's checkpoints (and share a
metrics history), so the second one stops at once and names the first. The file (`run.lock`) holds the
holder's pid, host and start time; the exclusion itself is an `flock` on it, which the kernel drops when
the holder dies however it dies, so a lock left behind by a killed run (kill -9, a lost node) is simply
taken over, with a warning naming the run that left it. The holder removes the file when it ends.
"""
from __future__ import annotations

import fcntl
import json
import os
import socket
import time

LOCK_FILE = "run.lock"


class RunLockError(RuntimeError):
    """Another live run holds the output folder."""


def _describe(holder: dict) -> str:
    started = holder.get("started")
    when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(started)) if isinstance(started, (int, float)) else "?"
    return f"pid {holder.get('pid', '?')} on host {holder.get('host', '?')}, started {when}"


def _read(fd: int) -> dict:
    os.lseek(fd, 0, os.SEEK_SET)
    raw = b""
    while chunk := os.read(fd, 65536):
        raw += chunk
    try:
        holder = json.loads(raw.decode(errors="replace")) if raw.strip() else {}
    except ValueError:
        return {"pid": "?", "host": "?", "unreadable": raw[:80].decode(errors="replace")}
    return holder if isinstance(holder, dict) else {}


class RunLock:
    """`acquire()` takes the output folder for this process (or raises `RunLockError`); `release()` gives it
    back. Also a context manager."""

    def __init__(self, folder: str):
        self.folder = os.path.abspath(folder)
        self.path = os.path.join(self.folder, LOCK_FILE)
        self._fd: int | None = None
        self._made: list[str] = []  # folders the lock created, innermost first

    def acquire(self) -> RunLock:
        missing, folder = [], self.folder
        while not os.path.isdir(folder) and os.path.dirname(folder) != folder:
            missing.append(folder)
            folder = os.path.dirname(folder)
        os.makedirs(self.folder, exist_ok=True)
        self._made = missing
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _read(fd)
                os.close(fd)
                raise RunLockError(
                    f"another run is using the output folder {self.folder}: {_describe(holder)} (lock file "
                    f"{self.path}). Two runs in one folder overwrite each other's checkpoints and metrics. Wait for "
                    "it to end or stop it, or give this run a folder of its own with trainer.default_local_dir=<dir> "
                    "(or another trainer.experiment_name)."
                ) from None
            try:
                same_file = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same_file = False
            if same_file:
                break
            os.close(fd)  # the previous holder removed the file between our open and our lock: start over
        previous = _read(fd)
        if previous:
            print(f"WARNING: taking over {self.path}, left by a run that is no longer alive ({_describe(previous)})",
                  flush=True)
        me = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(me).encode(), 0)
        os.fsync(fd)
        self._fd = fd
        return self

    def release(self) -> None:
        """Remove the lock file (while still holding it, so no newcomer sees a half-released lock)."""
        if self._fd is None:
            return
        try:
            os.remove(self.path)
        except FileNotFoundError:
            pass
        os.close(self._fd)
        self._fd = None
        for folder in self._made:  # only those the run left empty
            try:
                os.rmdir(folder)
            except OSError:
                break
        self._made = []

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()
