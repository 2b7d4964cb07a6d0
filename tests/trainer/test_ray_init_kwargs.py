"""What the driver passes to ray.init (task_runner._init_ray), read off a stand-in for ray.init: a local
cluster starts no idle workers (ours are actors with env vars of their own) unless the user's
`_system_config` says otherwise; every worker gets a CPU slot; attaching to a running cluster passes neither.
It needs no plan: run_ppo makes the plan on a thread meanwhile."""
import os
import sys

import pytest
import ray

from verl.trainer.config_check import load_config
from verl.trainer.ppo import task_runner


@pytest.fixture
def captured(monkeypatch):
    calls = []
    monkeypatch.setattr(ray, "init", lambda **kwargs: calls.append(kwargs))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    return calls


def test_a_local_cluster_starts_no_idle_workers_and_cpu_workers_get_slots(captured):
    config = load_config(["trainer.n_gpus_per_node=64"], check=False)
    task_runner._init_ray(config)
    kwargs = captured[-1]
    assert kwargs["_system_config"] == task_runner.NO_PRESTART
    assert kwargs["num_cpus"] == max(os.cpu_count(), 64)
    assert kwargs["runtime_env"]["env_vars"]["TOKENIZERS_PARALLELISM"] == "true"
    task_runner._init_ray(load_config(["+ray_kwargs.ray_init.num_cpus=3"], check=False))
    assert captured[-1]["num_cpus"] == 3           # the user's count stands


def test_the_users_system_config_wins_and_attaching_passes_none(captured, monkeypatch):
    config = load_config(["+ray_kwargs.ray_init._system_config={prestart_worker_first_driver:true,"
                          "object_timeout_milliseconds:5}"], check=False)
    task_runner._init_ray(config)
    assert captured[-1]["_system_config"] == {"prestart_worker_first_driver": True, "enable_worker_prestart": False,
                                              "object_timeout_milliseconds": 5}
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    monkeypatch.setattr(task_runner, "describe_nodes", lambda: "stand-in cluster")
    task_runner._init_ray(load_config(check=False))
    assert "_system_config" not in captured[-1] and "num_cpus" not in captured[-1]


def test_workers_share_the_drivers_bytecode_cache_only_when_it_turned_one_on(captured, monkeypatch, tmp_path):
    from verl.utils.startup import bytecode_cache

    config = load_config(check=False)
    task_runner._init_ray(config)
    assert "PYTHONPYCACHEPREFIX" not in captured[-1]["runtime_env"]["env_vars"]
    # what enable() changes, restored after the test
    for name in ("pycache_prefix", "dont_write_bytecode"):
        monkeypatch.setattr(sys, name, getattr(sys, name))
    for name in ("PYTHONPYCACHEPREFIX", "PYTHONDONTWRITEBYTECODE"):
        monkeypatch.setenv(name, os.environ.get(name, ""))
    monkeypatch.setattr(bytecode_cache, "_ENABLED", None)
    bytecode_cache.enable(str(tmp_path / "pycache"))
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")          # a cluster that does not inherit our environment
    monkeypatch.setattr(task_runner, "describe_nodes", lambda: "stand-in cluster")
    task_runner._init_ray(config)
    env_vars = captured[-1]["runtime_env"]["env_vars"]
    assert env_vars["PYTHONPYCACHEPREFIX"] == str(tmp_path / "pycache") and env_vars["PYTHONDONTWRITEBYTECODE"] == ""


def test_a_local_start_tells_ray_so_and_a_cluster_ray_start_recorded_is_attached(captured, monkeypatch, tmp_path):
    """address="local" spares Ray its search of every process on the host; a cluster that `ray start`
    recorded for this machine is attached to (as ray.init without an address does), with no CPU count."""
    config = load_config([f"+ray_kwargs.ray_init._temp_dir={tmp_path}"], check=False)
    task_runner._init_ray(config)
    assert captured[-1]["address"] == "local" and "num_cpus" in captured[-1]
    (tmp_path / "ray_current_cluster").write_text("10.0.0.7:6379\n")
    monkeypatch.setattr(task_runner, "describe_nodes", lambda: "stand-in cluster")
    task_runner._init_ray(config)
    assert "address" not in captured[-1] and "num_cpus" not in captured[-1] and "_system_config" not in captured[-1]
    task_runner._init_ray(load_config([f"+ray_kwargs.ray_init._temp_dir={tmp_path}",
                                       "+ray_kwargs.ray_init.address=local"], check=False))
    assert captured[-1]["address"] == "local" and "num_cpus" in captured[-1]   # the user's "local" starts one
