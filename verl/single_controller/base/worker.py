"""`Worker`: the base class of everything a worker group runs, one instance per process.

The worker group starts each worker with torchrun-style variables in its environment (RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT); `Worker` reads them so subclasses can call
`torch.distributed.init_process_group(backend=plan.dist_backend, init_method="env://", ...)` themselves.
Without those variables (a worker built directly, e.g. in a test) it is rank 0 of 1.
"""

from __future__ import annotations

import os

from .decorator import Dispatch, Execute, register


class Worker:
    def __init__(self) -> None:
        self._rank = int(os.environ.get("RANK", 0))
        self._world_size = int(os.environ.get("WORLD_SIZE", 1))
        self._local_rank = int(os.environ.get("LOCAL_RANK", 0))
        self._local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", 1))
        self._master_addr = os.environ.get("MASTER_ADDR")
        self._master_port = os.environ.get("MASTER_PORT")

    @classmethod
    def env_keys(cls) -> list[str]:
        """The environment variables a worker group sets for each worker."""
        return ["WORLD_SIZE", "RANK", "LOCAL_WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"]

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def world_size(self) -> int:
        return self._world_size

    @property
    def local_rank(self) -> int:
        """Rank among the workers of this node (torchrun's LOCAL_RANK)."""
        return self._local_rank

    @property
    def local_world_size(self) -> int:
        return self._local_world_size

    @property
    def device_index(self) -> int:
        """Index of this worker's accelerator among the devices this process can see.

        Ray narrows CUDA_VISIBLE_DEVICES to the GPU it assigned to the actor, so there the answer is the
        position of that GPU in the list (usually 0), not LOCAL_RANK; elsewhere it is LOCAL_RANK.
        """
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        assigned = _ray_gpu_ids()
        if visible and assigned:
            ids = visible.split(",")
            if assigned[0] in ids:
                return ids.index(assigned[0])
        return self._local_rank

    def get_master_addr_port(self) -> tuple[str | None, str | None]:
        return self._master_addr, self._master_port

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO_WITH_FUNC)
    def execute_with_func_generator(self, func, *args, **kwargs):
        """Run `func(self, *chunks)` on every worker with its share of the DataProto arguments."""
        return func(self, *args, **kwargs)

    @register(dispatch_mode=Dispatch.ALL_TO_ALL, execute_mode=Execute.RANK_ZERO)
    def execute_func_rank_zero(self, func, *args, **kwargs):
        """Run `func(*args, **kwargs)` on rank 0 only."""
        return func(*args, **kwargs)


def _ray_gpu_ids() -> list[str]:
    """GPU ids Ray assigned to this process (empty outside a Ray worker)."""
    try:
        import ray
    except ImportError:
        return []
    if not ray.is_initialized():
        return []
    return [str(i) for i in ray.get_runtime_context().get_accelerator_ids().get("GPU", [])]
