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
        # per device mesh (e.g. "actor", "ref"): this worker's data-parallel rank, and whether its output is
        # collected (one rank per DP group answers) - what upstream's nd dispatch reads
        self._dispatch_dp_rank: dict[str, int] = {}
        self._collect_dp_rank: dict[str, bool] = {}

    def _register_dispatch_collect_info(self, mesh_name: str, dp_rank: int, is_collect: bool) -> None:
        """Record this worker's place in mesh `mesh_name` (once per mesh)."""
        if mesh_name in self._dispatch_dp_rank or mesh_name in self._collect_dp_rank:
            raise ValueError(f"mesh {mesh_name!r} is already registered in {type(self).__name__}")
        self._dispatch_dp_rank[mesh_name] = dp_rank
        self._collect_dp_rank[mesh_name] = is_collect

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def _query_dispatch_info(self, mesh_name: str) -> int:
        """This worker's data-parallel rank in mesh `mesh_name`."""
        if mesh_name not in self._dispatch_dp_rank:
            raise AssertionError(f"mesh {mesh_name!r} is not registered in {type(self).__name__}")
        return self._dispatch_dp_rank[mesh_name]

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def _query_collect_info(self, mesh_name: str) -> bool:
        """Whether this worker's output is collected for mesh `mesh_name`."""
        if mesh_name not in self._collect_dp_rank:
            raise AssertionError(f"mesh {mesh_name!r} is not registered in {type(self).__name__}")
        return self._collect_dp_rank[mesh_name]

    def get_dispatch_collect(self) -> dict:
        """{"dispatch_dp_rank": {mesh: rank}, "collect_dp_rank": {mesh: bool}} of every registered mesh."""
        return {"dispatch_dp_rank": self._dispatch_dp_rank, "collect_dp_rank": self._collect_dp_rank}

    def set_dispatch_collect(self, mesh_name: str, dispatch_dp_rank: dict[str, int],
                             collect_dp_rank: dict[str, bool]) -> None:
        """Adopt another worker's registration (`get_dispatch_collect()` of a worker it hosts, e.g. the ref
        inside a colocated actor_rollout_ref) under `mesh_name`; a mesh registered twice is an error."""
        if mesh_name in self._dispatch_dp_rank or mesh_name in self._collect_dp_rank:
            raise AssertionError(f"mesh {mesh_name!r} is already registered: {sorted(self._dispatch_dp_rank)}")
        for rank in dispatch_dp_rank.values():
            self._dispatch_dp_rank[mesh_name] = rank
        for is_collect in collect_dp_rank.values():
            self._collect_dp_rank[mesh_name] = is_collect

    @classmethod
    def env_keys(cls) -> list[str]:
        """The environment variables a worker group sets for each worker."""
        return ["WORLD_SIZE", "RANK", "LOCAL_WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"]

    # read-only views of the torchrun variables read at construction; local_* count the workers of this node
    rank = property(lambda self: self._rank)
    world_size = property(lambda self: self._world_size)
    local_rank = property(lambda self: self._local_rank)
    local_world_size = property(lambda self: self._local_world_size)

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
