"""Free-space checks before a checkpoint is written, and the error a full disk turns into.

A save that runs out of space half-way leaves nothing behind (its writer removes what it wrote), and
`CheckpointSpaceError` says which folder, how much the checkpoint needs and how much the disk had, in
place of the bare `iostream error` or `No space left on device` that torch or the OS would give.
"""
from __future__ import annotations

import errno
import os
import shutil

# What a save needs beyond the tensors' bytes (file headers, alignment, config and tokenizer files).
SLACK_FRACTION = 0.05
SLACK_BYTES = 64 << 20
_FULL = (errno.ENOSPC, errno.EDQUOT)
_ADVICE = "point trainer.default_local_dir at a larger disk"


class CheckpointSpaceError(OSError):
    """Not enough disk space for a checkpoint; nothing of the failed save is left on disk."""

    def __init__(self, folder: str, needed: int, free: int, during: bool = False):
        self.folder, self.needed, self.free = folder, needed, free
        if during:
            what = (f"ran out of disk space while saving the checkpoint {folder}: it needs about {_size(needed)}, and "
                    f"{_size(free)} are free on that disk now")
        else:
            what = (f"not enough disk space to save the checkpoint {folder}: it needs about {_size(needed)}, and "
                    f"{_size(free)} are free on that disk")
        super().__init__(
            errno.ENOSPC,
            f"{what}. Free space there, {_ADVICE}, or keep fewer checkpoints (trainer.max_actor_ckpt_to_keep / "
            "max_critic_ckpt_to_keep). What this save had written was removed; the previous checkpoint is intact.",
        )

    def __reduce__(self):  # travels from a Ray worker to the driver intact
        return type(self), (self.folder, self.needed, self.free, self.args[1].startswith("ran out"))


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} bytes"


def free_bytes(path: str) -> int:
    """Free bytes on the disk that holds `path` (or its nearest existing parent)."""
    path = os.path.abspath(path)
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return shutil.disk_usage(path).free


def with_slack(tensor_bytes: int) -> int:
    return int(tensor_bytes * (1 + SLACK_FRACTION)) + SLACK_BYTES


def require_space(folder: str, needed: int) -> None:
    """Raise `CheckpointSpaceError` unless the disk holding `folder` has `needed` bytes free."""
    free = free_bytes(folder)
    if needed > free:
        raise CheckpointSpaceError(folder, needed, free)


def is_disk_full(err: BaseException) -> bool:
    """A full disk as the OS or torch reports it (torch's writer says only `iostream error`)."""
    return isinstance(err, OSError) and err.errno in _FULL or (
        isinstance(err, RuntimeError) and any(s in str(err) for s in ("No space left", "iostream error")))


def needs_explaining(err: BaseException) -> bool:
    """A full disk not yet explained by a `CheckpointSpaceError` (one raised in a worker reaches the driver
    as the text of a worker error, which is left as it is)."""
    return is_disk_full(err) and not isinstance(err, CheckpointSpaceError) and _ADVICE not in str(err)
