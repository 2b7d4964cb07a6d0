"""File operations on local paths and `hdfs://` paths (upstream's `verl.utils.hdfs_io`).

Local paths use the standard library; `hdfs://` paths go through the `hdfs` command-line client, and say so
when it is not on PATH.
"""
from __future__ import annotations

import os
import shutil
import subprocess

from verl.utils.fs import is_non_local

__all__ = ["exists", "makedirs", "copy"]


def _hdfs(*args: str, timeout: float | None = None, check: bool = True) -> subprocess.CompletedProcess:
    client = shutil.which("hdfs")
    if client is None:
        raise RuntimeError(f"hdfs:// paths need the `hdfs` command-line client on PATH (for: hdfs dfs {' '.join(args)})")
    done = subprocess.run([client, "dfs", *args], capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise RuntimeError(f"hdfs dfs {' '.join(args)} failed: {done.stderr.strip()}")
    return done


def exists(path: str, **kwargs) -> bool:
    """Whether `path` exists (an `hdfs dfs -test -e` for hdfs:// paths)."""
    if is_non_local(path):
        return _hdfs("-test", "-e", path, check=False).returncode == 0
    return os.path.exists(path)


def makedirs(name: str, mode: int = 0o777, exist_ok: bool = False, **kwargs) -> None:
    """`os.makedirs` for local paths, `hdfs dfs -mkdir -p` for hdfs:// paths."""
    if is_non_local(name):
        if not exist_ok and exists(name):
            raise FileExistsError(name)
        _hdfs("-mkdir", "-p", name)
    else:
        os.makedirs(name, mode=mode, exist_ok=exist_ok)


def copy(src: str, dst: str, **kwargs) -> bool:
    """Copy a file or a folder; either side may be hdfs:// (put, get or cp). Returns True."""
    timeout = kwargs.get("timeout")
    if is_non_local(src) or is_non_local(dst):
        if is_non_local(src) and is_non_local(dst):
            _hdfs("-cp", "-f", src, dst, timeout=timeout)
        elif is_non_local(dst):
            _hdfs("-put", "-f", src, dst, timeout=timeout)
        else:
            _hdfs("-get", src, dst, timeout=timeout)
        return True
    if os.path.isdir(src):
        shutil.copytree(src, dst, dirs_exist_ok=True)
    else:
        shutil.copy(src, dst)
    return True
