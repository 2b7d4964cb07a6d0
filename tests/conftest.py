"""Shared test setup: few torch threads, one Ray instance per test session started on demand, and the
order in which test files are handed to pytest-xdist's workers.

Tests that need Ray take the `ray_session` fixture; Ray starts the first time one asks and stops at the
end of the session. Tests that don't ask never start it.

`scripts/run_tests.sh` runs the suite on pytest-xdist workers (`-n 2 --dist loadfile`: each file on one
worker). Each worker is its own session, so each has its own Ray; they must not meet: every worker gets
a private RAY_TMPDIR (which every Ray its tests start, in process or in a subprocess, inherits) and its
own namespace, and Ray picks free ports itself.
"""

import os
import shutil
import tempfile
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER")   # "gw0", "gw1", ... under pytest-xdist; None otherwise

# set before ray or torch is imported anywhere in the session
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

RAY_NUM_CPUS = 4  # logical: two 1-CPU workers and a driver-side actor fit even on a 2-core machine
RAY_OBJECT_STORE_BYTES = 200 * 1024**2

# Files handed out first: the end-to-end runs take most of the suite's time, so with them first the
# workers finish together instead of one running a long file at the end while the other idles.
LONG_FIRST = "e2e"


def pytest_configure(config):
    import torch

    torch.set_num_threads(1)
    if XDIST_WORKER:
        # short and under /tmp: Ray's socket paths inside it must stay under 108 characters
        ray_tmp = tempfile.mkdtemp(prefix=f"ray-{XDIST_WORKER}-", dir="/tmp" if os.path.isdir("/tmp") else None)
        os.environ["RAY_TMPDIR"] = ray_tmp
        config.add_cleanup(lambda: shutil.rmtree(ray_tmp, ignore_errors=True))
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False   # xdist would sort files by test count: keep the order below


def _file_rank(item) -> tuple[int, int]:
    """Sort key of an item's file: end-to-end files first, and among those the ones with slow tests."""
    path = Path(str(item.path))
    long_run = LONG_FIRST in path.relative_to(REPO_ROOT).parts if path.is_relative_to(REPO_ROOT) else False
    return (0 if long_run else 1, 0 if item.get_closest_marker("slow") else 1)


def pytest_collection_modifyitems(config, items):
    """Order whole files (tests within a file keep their order): a file goes where its best-ranked test
    puts it. With `--dist loadfile` xdist hands files out in this order."""
    rank: dict[Path, tuple[int, int]] = {}
    first: dict[Path, int] = {}
    for index, item in enumerate(items):
        path = Path(str(item.path))
        rank[path] = min(rank.get(path, (2, 2)), _file_rank(item))
        first.setdefault(path, index)
    items.sort(key=lambda item: (rank[Path(str(item.path))], first[Path(str(item.path))]))


@pytest.fixture(scope="session")
def ray_session():
    """A local Ray instance shared by every test of this session (of this xdist worker) that asks for it;
    workers import `verl` from this checkout."""
    import ray

    if ray.is_initialized():  # started elsewhere in this process: use it, leave it running
        yield ray
        return
    pythonpath = os.pathsep.join(p for p in [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")] if p)
    ray.init(
        address="local",   # never attach to a cluster some other process recorded on this machine
        namespace=f"verl-tests-{XDIST_WORKER or 'main'}",
        num_cpus=RAY_NUM_CPUS,
        include_dashboard=False,
        object_store_memory=RAY_OBJECT_STORE_BYTES,
        log_to_driver=False,
        runtime_env={
            "env_vars": {
                "PYTHONPATH": pythonpath,
                "RAY_USAGE_STATS_ENABLED": "0",
                "OMP_NUM_THREADS": "1",
                "TOKENIZERS_PARALLELISM": "false",
            }
        },
    )
    try:
        yield ray
    finally:
        ray.shutdown()
