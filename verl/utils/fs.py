"""Model paths as upstream users write them: a local folder, a Hugging Face hub id, or `hdfs://...`.

Everything that reads a model (the planner's config.json, the workers' weights, the tokenizer, the
critic) goes through `resolve_model_path`, so `actor_rollout_ref.model.path=Qwen/Qwen2.5-0.5B-Instruct`
works wherever a local folder does. Hub ids come from the Hugging Face cache first; the hub is asked
only when the files are not cached and `HF_HUB_OFFLINE` is not set. Remote (`hdfs://`) paths are
copied to a local cache folder once, as upstream's `copy_to_local` does.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile

__all__ = ["copy_to_local", "is_non_local", "resolve_model_path"]

_REMOTE_PREFIX = "hdfs://"
_HDFS_COPY_TIMEOUT_S = 3600
SHM_CACHE_DIR = "/dev/shm/verl-cache"


def is_non_local(path: str) -> bool:
    """True for paths that must be copied before use (`hdfs://...`)."""
    return str(path).startswith(_REMOTE_PREFIX)


def _cache_slot(src: str, cache_dir: str) -> str:
    """`<cache_dir>/<md5 of src>/<basename>`: one folder per remote path, so two paths never collide."""
    digest = hashlib.md5(src.encode()).hexdigest()
    return os.path.join(cache_dir, digest, os.path.basename(src.rstrip("/")))


def _hdfs_get(src: str, dst: str) -> None:
    binary = shutil.which("hdfs")
    if binary is None:
        raise FileNotFoundError(
            f"'{src}' is an HDFS path, but no `hdfs` command is on PATH to copy it. Install the Hadoop "
            f"client, or copy the folder yourself and point the config at the local copy.")
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    partial = dst + ".partial"
    shutil.rmtree(partial, ignore_errors=True)
    subprocess.run([binary, "dfs", "-get", src, partial], check=True, timeout=_HDFS_COPY_TIMEOUT_S)
    os.replace(partial, dst)   # a finished copy appears at once; an interrupted one is redone


def copy_to_local(src: str, cache_dir: str | None = None, filelock: str = ".file.lock", verbose: bool = False,
                  always_recopy: bool = False, use_shm: bool = False) -> str:
    """A local path for `src` (upstream's signature). Local paths come back unchanged; `hdfs://` paths
    are copied under `cache_dir` (the temp dir by default) unless a finished copy is already there.
    `use_shm` additionally resolves a hub id, and copies the result under /dev/shm. (`filelock` is accepted
    for upstream's signature; the lock file sits next to the copy.)"""
    from filelock import FileLock

    src = str(src)
    local = src
    if is_non_local(src):
        cache_dir = cache_dir or tempfile.gettempdir()
        local = _cache_slot(src, cache_dir)
        os.makedirs(os.path.dirname(local), exist_ok=True)
        with FileLock(local + ".lock"):
            if always_recopy and os.path.isdir(local):
                shutil.rmtree(local)
            elif always_recopy and os.path.exists(local):
                os.remove(local)
            if not os.path.exists(local):
                if verbose:
                    print(f"copying {src} to {local}")
                _hdfs_get(src, local)
    if use_shm:
        local = _copy_to_shm(resolve_model_path(local))
    return local


def _copy_to_shm(path: str) -> str:
    """Upstream's `use_shm`: keep the model files in RAM-backed /dev/shm for faster repeated loads."""
    dst = _cache_slot(os.path.abspath(path), SHM_CACHE_DIR)
    if not os.path.exists(dst):
        shutil.copytree(path, dst + ".partial", dirs_exist_ok=True)
        os.replace(dst + ".partial", dst)
    return dst


def _looks_like_repo_id(path: str) -> bool:
    parts = path.split("/")
    return 1 <= len(parts) <= 2 and all(parts) and not path.startswith((".", "~"))


def _from_hub(repo_id: str, filename: str | None, revision: str | None) -> str:
    """The cached file (or snapshot folder) for a hub id; downloaded only when absent and online."""
    from huggingface_hub import constants, hf_hub_download, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    def fetch(local_only: bool) -> str:
        if filename is None:
            return snapshot_download(repo_id, revision=revision, local_files_only=local_only)
        return hf_hub_download(repo_id, filename, revision=revision, local_files_only=local_only)

    try:
        return fetch(local_only=True)
    except LocalEntryNotFoundError:
        if constants.HF_HUB_OFFLINE:
            raise FileNotFoundError(
                f"'{repo_id}' is not a local folder and is not in the Hugging Face cache "
                f"({constants.HF_HUB_CACHE}), "
                f"and HF_HUB_OFFLINE is set. Download it first (`huggingface-cli download {repo_id}`) or "
                f"point the config at a local folder.") from None
    return fetch(local_only=False)


def resolve_model_path(path: str, filename: str | None = None, revision: str | None = None) -> str:
    """A local folder for a model path (or, with `filename`, the local path of that one file in it).

    Order: an existing local path; an `hdfs://` path (copied); a hub id (`org/name`) from the Hugging
    Face cache, else downloaded unless `HF_HUB_OFFLINE` is set. Anything else is a clear error.
    """
    path = str(path)
    if is_non_local(path):
        path = copy_to_local(path)
    expanded = os.path.expanduser(path)
    if os.path.exists(expanded):
        if filename is None:
            return expanded
        if os.path.isdir(expanded):
            return os.path.join(expanded, filename)
        return expanded   # a file given directly (e.g. a config.json path)
    if not _looks_like_repo_id(path):
        raise FileNotFoundError(f"model path '{path}' is neither a local file/folder nor a Hugging Face hub id "
                                f"(org/name).")
    return _from_hub(path, filename, revision)
