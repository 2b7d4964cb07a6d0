"""The Ray runtime environment the PPO trainer gives its workers (upstream's `verl.trainer.constants_ppo`).

The variables are the task runner's `WORKER_ENV`; hardware-specific ones upstream adds here (NCCL, ROCm,
CUDA_DEVICE_MAX_CONNECTIONS for Megatron) are verl.compat's business in this verl.
"""
from __future__ import annotations

import json
import os

from verl.trainer.ppo.task_runner import WORKER_ENV

__all__ = ["NVTX_INJECTION_ENV", "PPO_RAY_RUNTIME_ENV", "get_ppo_ray_runtime_env"]

NVTX_INJECTION_ENV = "NVTX_INJECTION64_PATH"
# a path that does not exist: NVTX finds no injection library and the CUPTI slot stays free for the profiler
_NVTX_INJECTION_OFF = "/nonexistent/verl-disabled-nvtx-injection.so"
_JOB_CONFIG_ENV = "RAY_JOB_CONFIG_JSON_ENV_VAR"

PPO_RAY_RUNTIME_ENV = {"env_vars": dict(WORKER_ENV)}


def _profiler_tool(config):
    if config is None:
        return None
    from omegaconf import OmegaConf

    return OmegaConf.select(config, "global_profiler.tool", default=None)


def get_ppo_ray_runtime_env(config=None) -> dict:
    """The runtime env for ray.init: the worker variables not already set in this process, `working_dir: None`
    unless a submitted job brings one, and, for a torch-profiler run, an NVTX injection inherited from the
    image pointed at nothing (it would take the CUPTI slot the profiler needs; VERL_KEEP_NVTX_INJECTION=1
    keeps it)."""
    job = json.loads(os.environ.get(_JOB_CONFIG_ENV, "{}") or "{}")
    env_vars = {k: v for k, v in PPO_RAY_RUNTIME_ENV["env_vars"].items() if os.environ.get(k) is None}
    if (_profiler_tool(config) == "torch" and os.environ.get(NVTX_INJECTION_ENV)
            and os.environ.get("VERL_KEEP_NVTX_INJECTION") != "1"):
        env_vars[NVTX_INJECTION_ENV] = _NVTX_INJECTION_OFF
    runtime_env = {"env_vars": env_vars}
    if job.get("runtime_env", {}).get("working_dir") is None:
        runtime_env["working_dir"] = None
    return runtime_env
