"""Shared test setup: few torch threads, and one Ray instance for the whole session, started on demand.

Tests that need Ray take the `ray_session` fixture; Ray starts the first time one asks and stops at the
end of the session. Tests that don't ask never start it.
"""

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]

# set before ray or torch is imported anywhere in the session
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

RAY_NUM_CPUS = 4  # logical: two 1-CPU workers and a driver-side actor fit even on a 2-core machine
RAY_OBJECT_STORE_BYTES = 200 * 1024**2


def pytest_configure(config):
    import torch

    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def ray_session():
    """A local Ray instance shared by every test that asks for it; workers import `verl` from this checkout."""
    import ray

    if ray.is_initialized():  # started elsewhere in this process: use it, leave it running
        yield ray
        return
    pythonpath = os.pathsep.join(p for p in [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")] if p)
    ray.init(
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
