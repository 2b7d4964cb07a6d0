"""The Ray backend of the single controller: resource pools, actor creation, calls with timeouts.

One Ray actor per bundle of a placement group; a bundle holds one GPU (`use_gpu=True`) or only CPUs
(`use_gpu=False`, for CPU training: then `n_gpus_per_node` counts CPU workers). Every wait has a timeout and
a failure names the worker rank and the method.
"""

from __future__ import annotations

import inspect
import logging
import os
import re
import socket
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Optional

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from verl.single_controller.base import ClassWithInitArgs, ResourcePool, Worker, WorkerGroup
from verl.single_controller.base.decorator import MAGIC_ATTR, ray_get_timeout
from verl.single_controller.base.worker_group import registered_methods

__all__ = [
    "RayResourcePool",
    "SubRayResourcePool",
    "split_resource_pool",
    "merge_resource_pool",
    "ResourcePoolManager",
    "RayClassWithInitArgs",
    "RayWorkerGroup",
    "create_colocated_worker_cls",
    "WorkerError",
    "WorkerDiedError",
    "WorkerGroupTimeoutError",
    "ResourceUnavailableError",
]

logger = logging.getLogger(__name__)

DEFAULT_PLACEMENT_TIMEOUT_S = 120.0
PEER_DEATH_GRACE_S = 10.0
_DEVICE_HINT = "set trainer.n_gpus_per_node / trainer.nnodes to what the cluster has, or use trainer.device=cpu"


# ---- errors -------------------------------------------------------------------------------------


class WorkerError(RuntimeError):
    """A worker raised inside a group call; the message carries its remote traceback."""

    def __init__(self, message: str, rank: int, method: str):
        super().__init__(message)
        self.rank, self.method = rank, method


class WorkerDiedError(WorkerError):
    """A worker process died (crash, OOM kill, os._exit) during a group call."""


class WorkerGroupTimeoutError(TimeoutError):
    """A group call did not finish within its timeout."""


class ResourceUnavailableError(RuntimeError):
    """The Ray cluster cannot provide what a resource pool asks for."""


def placement_timeout() -> float:
    """Seconds to wait for a placement group (env VERL_RAY_PLACEMENT_TIMEOUT, default 120)."""
    return float(os.environ.get("VERL_RAY_PLACEMENT_TIMEOUT", DEFAULT_PLACEMENT_TIMEOUT_S))


# ---- resource pools ---------------------------------------------------------------------------


def _addr_and_free_port() -> tuple[str, str]:
    """This node's address and a port free on it now (for the process group's rendezvous)."""
    with socket.socket() as sock:
        sock.bind(("", 0))
        port = sock.getsockname()[1]
    return ray.util.get_node_ip_address().strip("[]"), str(port)


_node_addr_and_free_port = ray.remote(num_cpus=0)(_addr_and_free_port)


def _on_this_node(pg: PlacementGroup, bundle_index: int = 0) -> bool:
    """Whether the bundle was placed on the driver's own node."""
    try:
        node = ray.util.placement_group_table(pg).get("bundles_to_node_id", {}).get(bundle_index)
    except Exception:  # noqa: BLE001 - an unexpected table layout: ask the node itself instead
        return False
    return node is not None and node == ray.get_runtime_context().get_node_id()


class RayResourcePool(ResourcePool):
    """Placement groups, one per node, one bundle per worker process.

    A bundle is {"CPU": num_cpus_per_bundle, "GPU": 1} with `use_gpu`, else {"CPU": num_cpus_per_bundle}.
    Up to `max_colocate_count` actors share a bundle; each asks for 1/max_colocate_count of it.
    """

    def __init__(
        self,
        process_on_nodes: Optional[list[int]] = None,
        use_gpu: bool = True,
        name_prefix: Optional[str] = None,
        max_colocate_count: int = 10,
        detached: bool = False,
        accelerator_type: Optional[str] = None,
        num_cpus_per_bundle: float = 1,
    ) -> None:
        super().__init__(process_on_nodes, max_colocate_count)
        self.use_gpu = use_gpu
        self.name_prefix = name_prefix if name_prefix is not None else uuid.uuid4().hex[:6]
        self.detached = detached
        self.accelerator_type = accelerator_type
        self.num_cpus_per_bundle = num_cpus_per_bundle
        self.pgs: Optional[list[PlacementGroup]] = None

    @property
    def device_kind(self) -> str:
        return "GPU" if self.use_gpu else "CPU"

    def bundle(self) -> dict[str, float]:
        bundle = {"CPU": self.num_cpus_per_bundle}
        if self.use_gpu:
            bundle["GPU"] = 1
            if self.accelerator_type is not None:
                bundle[f"accelerator_type:{self.accelerator_type}"] = 1e-3
        return bundle

    def actor_resources(self) -> dict[str, float]:
        """num_cpus / num_gpus options of one actor in a bundle."""
        share = {"num_cpus": self.num_cpus_per_bundle / self.max_colocate_count}
        if self.use_gpu:
            share["num_gpus"] = 1 / self.max_colocate_count
        return share

    def check_fits(self) -> None:
        """Fail fast, naming the shortfall, when the cluster can never hold this pool."""
        need = {key: amount * self.world_size for key, amount in self.bundle().items()}
        total = ray.cluster_resources()
        for key, amount in need.items():
            if total.get(key, 0) + 1e-9 < amount:
                what = "GPUs" if key == "GPU" else f"{key} units"
                raise ResourceUnavailableError(
                    f"resource pool '{self.name_prefix}' asks for {amount:g} {what} "
                    f"(process_on_nodes={self._store}, {self.bundle()} per worker) but the Ray cluster has "
                    f"{total.get(key, 0):g}: {_DEVICE_HINT}"
                )
        per_node = max(self._store, default=0)
        node_caps = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
        if not any(all(cap.get(k, 0) + 1e-9 >= v * per_node for k, v in self.bundle().items()) for cap in node_caps):
            raise ResourceUnavailableError(
                f"resource pool '{self.name_prefix}' puts {per_node} workers on one node "
                f"({self.bundle()} each) but no node has that much (largest: "
                f"{max((c.get(self.device_kind, 0) for c in node_caps), default=0):g} {self.device_kind}): {_DEVICE_HINT}"
            )

    def get_placement_groups(self, strategy: str = "STRICT_PACK", name: Optional[str] = None, device_name=None):
        """Create (once) and return the placement groups, sorted by node IP so ranks are stable.

        `device_name` is accepted for upstream's call sites; the bundle's device follows `use_gpu`.
        """
        if self.pgs is not None:
            return self.pgs
        self.check_fits()
        prefix = name or f"{self.name_prefix}_verl_group_{'_'.join(map(str, self._store))}:"
        lifetime = "detached" if self.detached else None
        pgs = [
            placement_group([self.bundle() for _ in range(count)], strategy=strategy, name=f"{prefix}{i}", lifetime=lifetime)
            for i, count in enumerate(self._store)
        ]
        timeout = placement_timeout()
        try:
            ray.get([pg.ready() for pg in pgs], timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            for pg in pgs:
                remove_placement_group(pg)
            raise ResourceUnavailableError(
                f"resource pool '{self.name_prefix}' (process_on_nodes={self._store}, {self.bundle()} per worker) "
                f"could not be placed within {timeout:g} s (VERL_RAY_PLACEMENT_TIMEOUT); the cluster has "
                f"{_short(ray.available_resources())} free of {_short(ray.cluster_resources())}. Other pools or "
                f"actors may hold the rest: {_DEVICE_HINT}"
            ) from None
        self.pgs = _sort_by_node_ip(pgs)
        return self.pgs

    def release(self) -> None:
        """Remove the placement groups (the actors placed in them are killed by Ray)."""
        for pg in self.pgs or []:
            remove_placement_group(pg)
        self.pgs = None

    def bundle_slots(self, strategy: str = "STRICT_PACK") -> list[tuple[int, PlacementGroup, int]]:
        """The bundles workers go on, in rank order: (index of the placement group, the group, bundle index)."""
        pgs = self.get_placement_groups(strategy=strategy)
        return [(pg_idx, pg, b) for pg_idx, pg in enumerate(pgs) for b in range(pg.bundle_count)]


class SubRayResourcePool(RayResourcePool):
    """A view of `subgroup_world_size` consecutive bundles of another pool's placement groups.

    Bundles are counted across `placement_groups` in rank order, from `start_bundle_index`. Worker groups
    built on views of one pool share its placement groups, so they land on disjoint bundles of it (e.g. a
    trainer and a rollout on the two halves of one node). The pool it was taken from owns the groups.
    """

    def __init__(
        self,
        placement_groups: list[PlacementGroup],
        start_bundle_index: int,
        subgroup_world_size: int,
        **kwargs,
    ) -> None:
        super().__init__(**kwargs)
        total = sum(pg.bundle_count for pg in placement_groups)
        if start_bundle_index < 0 or subgroup_world_size < 1 or start_bundle_index + subgroup_world_size > total:
            raise ValueError(
                f"bundles [{start_bundle_index}, {start_bundle_index + subgroup_world_size}) are not inside the "
                f"{total} bundles of the placement groups"
            )
        self.pgs = list(placement_groups)
        self.start_bundle_index = int(start_bundle_index)
        self.subgroup_world_size = int(subgroup_world_size)

    @property
    def world_size(self) -> int:
        return self.subgroup_world_size

    def bundle_slots(self, strategy: str = "STRICT_PACK") -> list[tuple[int, PlacementGroup, int]]:
        every = super().bundle_slots(strategy)
        return every[self.start_bundle_index : self.start_bundle_index + self.subgroup_world_size]

    def local_world_size_list(self) -> list[int]:
        """For each rank of the view, the bundle count of the placement group (node) it is on."""
        return [pg.bundle_count for _, pg, _ in self.bundle_slots()]

    def local_rank_list(self) -> list[int]:
        """For each rank of the view, its bundle's index in its placement group."""
        return [b for _, _, b in self.bundle_slots()]

    def release(self) -> None:
        """Nothing to remove: the placement groups belong to the pool this view was split from."""


def _pool_options(pool: RayResourcePool) -> dict:
    return {
        "use_gpu": pool.use_gpu,
        "max_colocate_count": pool.max_colocate_count,
        "detached": pool.detached,
        "accelerator_type": pool.accelerator_type,
        "num_cpus_per_bundle": pool.num_cpus_per_bundle,
    }


def split_resource_pool(
    resource_pool: RayResourcePool | SubRayResourcePool, split_size: int | list[int]
) -> list[SubRayResourcePool]:
    """Cut a pool (or a view, again) into consecutive views: equal parts of `split_size` bundles, or the listed sizes.

    The pool's placement groups are created here if they do not exist yet.
    """
    world = resource_pool.world_size
    if isinstance(split_size, int):
        if split_size < 1 or world % split_size:
            raise ValueError(f"split_size {split_size} does not divide the pool's {world} bundles")
        sizes = [split_size] * (world // split_size)
    else:
        sizes = [int(n) for n in split_size]
        if sum(sizes) != world or min(sizes, default=0) < 1:
            raise ValueError(f"split sizes {sizes} must be positive and sum to the pool's {world} bundles")
    pgs = resource_pool.get_placement_groups()
    start = getattr(resource_pool, "start_bundle_index", 0)
    views = []
    for i, size in enumerate(sizes):
        views.append(SubRayResourcePool(
            placement_groups=pgs,
            start_bundle_index=start,
            subgroup_world_size=size,
            process_on_nodes=resource_pool.store,
            name_prefix=f"{resource_pool.name_prefix}_split_{i}",
            **_pool_options(resource_pool),
        ))
        start += size
    return views


def merge_resource_pool(rp1: RayResourcePool, rp2: RayResourcePool) -> RayResourcePool:
    """One pool over the bundles of `rp1` then those of `rp2`.

    Two pools: their placement groups (created if need be) side by side. Two adjacent views of the same
    placement groups (`rp2` starting where `rp1` ends): the view over both, so merging the parts of a
    split gives back the whole.
    """
    mine, theirs = _pool_options(rp1), _pool_options(rp2)
    differ = sorted(k for k in mine if mine[k] != theirs[k])
    if differ:
        raise ValueError(f"cannot merge resource pools that differ in {differ}: {mine} vs {theirs}")
    name = f"{rp1.name_prefix}_{rp2.name_prefix}"
    views = isinstance(rp1, SubRayResourcePool), isinstance(rp2, SubRayResourcePool)
    if all(views):
        same_groups = [pg.id for pg in rp1.pgs] == [pg.id for pg in rp2.pgs]
        if not same_groups or rp1.start_bundle_index + rp1.world_size != rp2.start_bundle_index:
            raise ValueError("only adjacent views of the same placement groups merge (rp2 must start where rp1 ends)")
        return SubRayResourcePool(
            placement_groups=rp1.pgs,
            start_bundle_index=rp1.start_bundle_index,
            subgroup_world_size=rp1.world_size + rp2.world_size,
            process_on_nodes=rp1.store,
            name_prefix=name,
            **mine,
        )
    if any(views):
        raise ValueError("cannot merge a view of a pool (SubRayResourcePool) with a whole pool")
    merged = RayResourcePool(process_on_nodes=rp1.store + rp2.store, name_prefix=name, **mine)
    merged.pgs = rp1.get_placement_groups() + rp2.get_placement_groups()
    return merged


def _short(resources: dict) -> dict:
    return {k: round(v, 3) for k, v in resources.items() if k in ("CPU", "GPU")}


def _sort_by_node_ip(pgs: list[PlacementGroup]) -> list[PlacementGroup]:
    node_ip = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
    table = ray.util.placement_group_table()
    return sorted(pgs, key=lambda pg: node_ip.get(table[pg.id.hex()]["bundles_to_node_id"][0], ""))


@dataclass
class ResourcePoolManager:
    """Named resource pools and the role -> pool mapping the trainer uses.

    `resource_pool_spec = {"global_pool": [n_gpus_per_node] * nnodes}`; with `use_gpu=False` the numbers
    count CPU worker processes instead of GPUs.
    """

    resource_pool_spec: dict[str, list[int]]
    mapping: dict[Any, str]
    max_colocate_count: int = 3
    use_gpu: bool = True
    num_cpus_per_bundle: float = 1
    resource_pool_dict: dict[str, RayResourcePool] = field(default_factory=dict)

    def create_resource_pool(self) -> None:
        for name, process_on_nodes in self.resource_pool_spec.items():
            self.resource_pool_dict[name] = RayResourcePool(
                process_on_nodes=process_on_nodes,
                use_gpu=self.use_gpu,
                max_colocate_count=self.max_colocate_count,
                name_prefix=name,
                num_cpus_per_bundle=self.num_cpus_per_bundle,
            )
        self._check_resource_available()

    def get_resource_pool(self, role) -> RayResourcePool:
        return self.resource_pool_dict[self.mapping[role]]

    def get_n_gpus(self) -> int:
        """Worker processes over all pools (GPUs, or CPU workers when use_gpu=False)."""
        return sum(sum(nodes) for nodes in self.resource_pool_spec.values())

    def _check_resource_available(self) -> None:
        """Fail before any placement when the pools together exceed the cluster.

        Checked against the cluster's totals; resources held by others show up later, as a placement
        timeout that reports free versus total.
        """
        key = "GPU" if self.use_gpu else "CPU"
        per_worker = 1 if self.use_gpu else self.num_cpus_per_bundle
        need = self.get_n_gpus() * per_worker
        have = ray.cluster_resources().get(key, 0)
        if have + 1e-9 < need:
            unit = "GPUs" if self.use_gpu else "CPUs"
            raise ResourceUnavailableError(
                f"the resource pools {self.resource_pool_spec} need {need:g} {unit}, the Ray cluster has "
                f"{have:g}: {_DEVICE_HINT}"
            )
        for pool in self.resource_pool_dict.values():
            pool.check_fits()


# ---- actors -------------------------------------------------------------------------------------


def _unwrap_ray_remote(cls):
    return getattr(cls, "__ray_actor_class__", cls)


class RayClassWithInitArgs(ClassWithInitArgs):
    """A worker class (plain or `ray.remote`) with its constructor arguments and Ray actor options."""

    def __init__(self, cls, *args, **kwargs) -> None:
        super().__init__(cls if hasattr(cls, "__ray_actor_class__") else ray.remote(cls), *args, **kwargs)
        self._options: dict = {}
        self._additional_resource: dict = {}

    @property
    def user_cls(self):
        """The worker class itself (not its Ray actor wrapper)."""
        return _unwrap_ray_remote(self.cls)

    def set_additional_resource(self, additional_resource: dict) -> None:
        self._additional_resource = dict(additional_resource)

    def update_options(self, options: dict) -> None:
        self._options.update(options)

    def __call__(self, placement_group, placement_group_bundle_idx, options: Optional[dict] = None):
        """Start the actor in the given bundle; `options` (resources, env, name) add to the stored ones."""
        opts = {
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=placement_group, placement_group_bundle_index=placement_group_bundle_idx
            ),
            **self._options,
            **(options or {}),
        }
        if self._additional_resource:
            opts["resources"] = {**opts.get("resources", {}), **self._additional_resource}
        return self.cls.options(**opts).remote(*self.args, **self.kwargs)


class RayWorkerGroup(WorkerGroup):
    """One Ray actor per bundle of `resource_pool`, with the worker class's registered methods bound.

    Extra keyword arguments: `timeout_s` (per call, default VERL_RAY_GET_TIMEOUT or 3600), `worker_env`
    (more environment variables for the workers), `master_addr` / `master_port` (else a free port on the
    node of rank 0), `device_name` (recorded for callers). `ray_wait_register_center_timeout` bounds how
    long the actors may take to start.
    """

    def __init__(
        self,
        resource_pool: Optional[RayResourcePool] = None,
        ray_cls_with_init: Optional[RayClassWithInitArgs] = None,
        bin_pack: bool = True,
        name_prefix: Optional[str] = None,
        detached: bool = False,
        worker_names: Optional[list[str]] = None,
        worker_handles: Optional[list] = None,
        ray_wait_register_center_timeout: float = 300,
        **kwargs,
    ) -> None:
        super().__init__(resource_pool)
        self._master_addr = kwargs.pop("master_addr", None)
        self._master_port = kwargs.pop("master_port", None)
        if (self._master_addr is None) != (self._master_port is None):
            raise ValueError("give both master_addr and master_port, or neither (a free port is then picked)")
        self.timeout_s = float(kwargs.pop("timeout_s", None) or ray_get_timeout())
        self.customized_worker_env = dict(kwargs.pop("worker_env", None) or {})
        self.device_name = kwargs.pop("device_name", None)
        if kwargs:
            raise TypeError(f"RayWorkerGroup got unknown arguments {sorted(kwargs)}")
        self.ray_cls_with_init = ray_cls_with_init
        self.name_prefix = name_prefix if name_prefix is not None else uuid.uuid4().hex[:6]
        self.start_timeout_s = float(ray_wait_register_center_timeout)
        self.resource_pool = resource_pool
        self.sub_cls_name = ""
        self._node_ids: list[str] = []

        if resource_pool is None:
            self._workers = list(worker_handles) if worker_handles else [ray.get_actor(n) for n in worker_names]
            self._worker_names = list(worker_names or [])
        else:
            self._init_with_resource_pool(resource_pool, ray_cls_with_init, bin_pack, detached)
        if ray_cls_with_init is not None:
            self.method_names = self._bind_worker_method(ray_cls_with_init.user_cls)

    def _init_with_resource_pool(self, resource_pool, ray_cls_with_init, bin_pack, detached) -> None:
        # pgs are sorted by node IP, so read each node's size from its own group; a SubRayResourcePool
        # gives only its share of the bundles
        slots = resource_pool.bundle_slots(strategy="STRICT_PACK" if bin_pack else "PACK")
        _, first_pg, first_bundle = slots[0]
        if self._master_addr is None and _on_this_node(first_pg, first_bundle):
            # rank 0 runs on the driver's node: no task (and no worker process started for it) needed
            self._master_addr, self._master_port = _addr_and_free_port()
        elif self._master_addr is None:
            task = _node_addr_and_free_port.options(
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=first_pg, placement_group_bundle_index=first_bundle
                )
            ).remote()
            self._master_addr, self._master_port = self.wait(task, "find master address")

        cls_name = ray_cls_with_init.user_cls.__name__
        on_node = {}  # this group's workers per placement group (node): torchrun's LOCAL_WORLD_SIZE
        for pg_idx, _, _ in slots:
            on_node[pg_idx] = on_node.get(pg_idx, 0) + 1
        seen: dict[int, int] = {}
        for rank, (pg_idx, pg, bundle) in enumerate(slots):
            local_rank = seen[pg_idx] = seen.get(pg_idx, -1) + 1
            env = self._worker_env(rank, len(slots), local_rank, on_node[pg_idx], bundle, pg.bundle_count)
            name = f"{self.name_prefix}{cls_name}_{pg_idx}:{bundle}"
            options = {"runtime_env": {"env_vars": env}, "name": name, **resource_pool.actor_resources()}
            if detached:
                options["lifetime"] = "detached"
            self._workers.append(ray_cls_with_init(pg, bundle, options))
            self._worker_names.append(name)
        # surface constructor errors and unschedulable actors now, with the rank named; each worker
        # reports the node it really runs on (placement, error messages)
        self._node_ids = self.wait([w.__ray_call__.remote(_actor_node_id) for w in self._workers], "__init__",
                                   timeout_s=self.start_timeout_s)

    def _worker_env(self, rank, world_size, local_rank, local_world_size, bundle, bundles_on_node) -> dict[str, str]:
        env = {
            "WORLD_SIZE": str(world_size),
            "RANK": str(rank),
            "LOCAL_RANK": str(local_rank),
            "LOCAL_WORLD_SIZE": str(local_world_size),
            # upstream's names for the bundle's place in its node's placement group (equal to the two above
            # unless the group sits on part of the bundles, see SubRayResourcePool)
            "RAY_LOCAL_RANK": str(bundle),
            "RAY_LOCAL_WORLD_SIZE": str(bundles_on_node),
            "MASTER_ADDR": str(self._master_addr),
            "MASTER_PORT": str(self._master_port),
            "WG_PREFIX": self.name_prefix,
            "WG_BACKEND": "ray",
        }
        clash = set(env) & set(self.customized_worker_env)
        if clash:
            raise ValueError(f"worker_env may not override {sorted(clash)}: the worker group sets them")
        return {**env, **{k: str(v) for k, v in self.customized_worker_env.items()}}

    @classmethod
    def from_detached(cls, name_prefix=None, worker_names=None, worker_handles=None, ray_cls_with_init=None, **kwargs):
        """A group over actors that already exist (by handle or by name)."""
        return cls(
            resource_pool=None,
            ray_cls_with_init=ray_cls_with_init,
            name_prefix=name_prefix,
            worker_names=worker_names,
            worker_handles=worker_handles,
            **kwargs,
        )

    def spawn(self, prefix_set) -> dict[str, "RayWorkerGroup"]:
        """For a group of colocated workers: one group per role, over the same actors (same processes).

        The role group's `m(...)` calls the role's method `m` inside the shared actor.
        """
        roles = getattr(self.ray_cls_with_init.user_cls, "role_classes", None)
        if roles is None:
            raise TypeError("spawn() / fuse() need a group built from create_colocated_worker_cls(...) or a subclass "
                            "of create_colocated_worker_raw_cls(...)")
        groups = {}
        for role in prefix_set:
            group = RayWorkerGroup.from_detached(
                name_prefix=self.name_prefix,
                worker_names=self._worker_names,
                worker_handles=self._workers,
                timeout_s=self.timeout_s,
                device_name=self.device_name,
            )
            group._master_addr, group._master_port = self._master_addr, self._master_port
            group._node_ids = self._node_ids
            group.ray_cls_with_init = self.ray_cls_with_init
            group.sub_cls_name = role
            group.method_names = group._bind_worker_method(roles[role], remote_name=_RolePrefix(role))
            groups[role] = group
        return groups

    def fuse(self, prefix_set) -> None:
        """`spawn(prefix_set)`, each role's group set as `self.<role>` (upstream's fused worker groups)."""
        for role, group in self.spawn(prefix_set).items():
            setattr(self, role, group)

    # ---- execution -----------------------------------------------------------------------------
    def _remote(self, worker, method_name: str, *args, **kwargs):
        return getattr(worker, method_name).remote(*args, **kwargs)

    def _per_worker(self, args, kwargs) -> bool:
        """True when every argument is a list with one entry per worker (what dispatch functions make)."""
        values = [*args, *kwargs.values()]
        return bool(values) and all(isinstance(v, list) and len(v) == len(self._workers) for v in values)

    def execute_all_async(self, method_name: str, *args, **kwargs) -> list:
        """Start `method_name` on every worker. Arguments that are all lists of world_size are split
        one element per worker; otherwise every worker gets the same arguments."""
        if self._per_worker(args, kwargs):
            return [
                self._remote(w, method_name, *(a[i] for a in args), **{k: v[i] for k, v in kwargs.items()})
                for i, w in enumerate(self._workers)
            ]
        return [self._remote(w, method_name, *args, **kwargs) for w in self._workers]

    execute_all = execute_all_async

    def execute_all_sync(self, method_name: str, *args, **kwargs) -> list:
        return self.wait(self.execute_all_async(method_name, *args, **kwargs), method_name)

    def execute_rank_zero_async(self, method_name: str, *args, **kwargs):
        """Start `method_name` on rank 0 only (with its share when the arguments are per-worker lists)."""
        if self._per_worker(args, kwargs):
            args, kwargs = tuple(a[0] for a in args), {k: v[0] for k, v in kwargs.items()}
        return self._remote(self._workers[0], method_name, *args, **kwargs)

    execute_rank_zero = execute_rank_zero_async

    def execute_rank_zero_sync(self, method_name: str, *args, **kwargs):
        return self.wait(self.execute_rank_zero_async(method_name, *args, **kwargs), method_name)

    def wait(self, futures, method_name: str, timeout_s: Optional[float] = None):
        """Results of the futures (a list, by rank, or one future for rank 0) within the timeout.

        The first failure cancels the other calls and raises `WorkerError` / `WorkerDiedError` naming
        the rank and the method; running out of time raises `WorkerGroupTimeoutError`.
        """
        single = not isinstance(futures, list)
        refs = [futures] if single else list(futures)
        timeout = self.timeout_s if timeout_s is None else timeout_s
        rank_of = {ref: rank for rank, ref in enumerate(refs)}
        pending, results = list(refs), {}
        deadline = time.monotonic() + timeout
        while pending:
            remaining = deadline - time.monotonic()
            ready, pending = ray.wait(pending, num_returns=1, timeout=max(remaining, 0))
            if not ready:
                _cancel(pending)
                waiting = sorted(rank_of[r] for r in pending)
                raise WorkerGroupTimeoutError(
                    f"{self._describe(method_name)} did not finish within {timeout:g} s; ranks still running: "
                    f"{waiting}. Raise the limit with VERL_RAY_GET_TIMEOUT (seconds) if the work is just slow."
                )
            for ref in ready:
                try:
                    results[ref] = ray.get(ref)
                except ray.exceptions.RayTaskError as err:
                    rank = rank_of[ref]
                    dead = self._dead_peer(pending, rank_of)
                    _cancel(pending)
                    if dead is not None:  # this rank's collective broke because a peer's process is gone
                        dead_rank, dead_err = dead
                        raise WorkerDiedError(
                            f"worker rank {dead_rank} ({self._name_of(dead_rank)}{self._on_node(dead_rank)}) died "
                            f"during {self._describe(method_name)}; rank {rank} then failed too: "
                            f"{_last_line(err)}. Ray says: {_strip_ansi(str(dead_err))}",
                            dead_rank,
                            method_name,
                        ) from None
                    raise WorkerError(
                        f"{self._describe(method_name)} failed on worker rank {rank} "
                        f"({self._name_of(rank)}):\n{_strip_ansi(str(err))}",
                        rank,
                        method_name,
                    ) from None
                except ray.exceptions.RayActorError as err:
                    _cancel(pending)
                    rank = rank_of[ref]
                    if "creation task" in str(err):  # the worker's constructor raised
                        raise WorkerError(
                            f"worker rank {rank} ({self._name_of(rank)}) of worker group '{self.name_prefix}' "
                            f"failed to start:\n{_strip_ansi(str(err))}",
                            rank,
                            method_name,
                        ) from None
                    raise WorkerDiedError(
                        f"worker rank {rank} ({self._name_of(rank)}{self._on_node(rank)}) died during "
                        f"{self._describe(method_name)}; "
                        f"the other ranks' calls were cancelled. Ray says: {_strip_ansi(str(err))}",
                        rank,
                        method_name,
                    ) from None
        ordered = [results[ref] for ref in refs]
        return ordered[0] if single else ordered

    def _dead_peer(self, pending, rank_of) -> Optional[tuple[int, Exception]]:
        """After one rank raised: (rank, error) of a still-pending rank whose process died, if one did.

        A worker lost with its node makes its peers' collectives fail ("connection reset") moments before
        Ray reports the loss itself; waiting up to PEER_DEATH_GRACE_S for that report lets the error name
        the worker and node that are gone rather than the survivor that noticed.
        """
        if not pending:
            return None
        done, _ = ray.wait(list(pending), num_returns=len(pending), timeout=PEER_DEATH_GRACE_S)
        for ref in sorted(done, key=rank_of.get):
            try:
                ray.get(ref, timeout=0)
            except ray.exceptions.RayActorError as err:
                if "creation task" not in str(err):
                    return rank_of[ref], err
            except ray.exceptions.RayError:
                pass
        return None

    def _describe(self, method_name: str) -> str:
        role = f"{self.sub_cls_name}." if self.sub_cls_name else ""
        return f"`{role}{method_name}` of worker group '{self.name_prefix}'"

    def _name_of(self, rank: int) -> str:
        return self._worker_names[rank] if rank < len(self._worker_names) else "actor"

    def _on_node(self, rank: int) -> str:
        if rank >= len(self._node_ids):
            return ""
        alive = {n["NodeID"]: n.get("Alive") for n in ray.nodes()}
        state = "" if alive.get(self._node_ids[rank]) else ", now dead"
        return f" on node {self._node_ids[rank]}{state}"

    def describe_placement(self) -> str:
        """Which worker ranks run on which Ray node (as the workers themselves reported), one line per node."""
        addresses = {n["NodeID"]: n["NodeManagerAddress"] for n in ray.nodes()}
        by_node: dict[str, list[int]] = {}
        for rank, node in enumerate(self._node_ids):
            by_node.setdefault(node, []).append(rank)
        lines = [f"Worker placement: {len(self._node_ids)} worker(s) on {len(by_node)} node(s), "
                 f"MASTER_ADDR {self._master_addr}:{self._master_port}"]
        lines += [f"  node {node} ({addresses.get(node, '?')}): ranks {ranks}" for node, ranks in by_node.items()]
        return "\n".join(lines)

    def shutdown(self) -> None:
        """Kill the actors (they also end when the driver exits)."""
        for worker in self._workers:
            ray.kill(worker)
        self._workers = []

    # ---- properties -----------------------------------------------------------------------------
    @property
    def worker_names(self) -> list[str]:
        return self._worker_names

    @property
    def workers(self) -> list:
        return self._workers

    @property
    def node_ids(self) -> list[str]:
        """The Ray node id each worker rank runs on."""
        return self._node_ids

    @property
    def master_address(self):
        return self._master_addr

    @property
    def master_port(self):
        return self._master_port


def _actor_node_id(actor_instance) -> str:
    return ray.get_runtime_context().get_node_id()


def _last_line(err: Exception) -> str:
    lines = [line for line in _strip_ansi(str(err)).splitlines() if line.strip()]
    return lines[-1].strip() if lines else type(err).__name__


def _strip_ansi(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def _cancel(refs) -> None:
    """Best effort: queued calls are dropped; a method already running in a worker runs on."""
    for ref in refs:
        try:
            ray.cancel(ref)
        except (ValueError, TypeError, ray.exceptions.RayError):
            pass


class _RolePrefix:
    def __init__(self, role: str):
        self.role = role

    def __call__(self, name: str) -> str:
        return f"{self.role}_{name}"


# ---- colocation ---------------------------------------------------------------------------------


def create_colocated_worker_cls(class_dict: dict[str, RayClassWithInitArgs]) -> RayClassWithInitArgs:
    """One actor class that holds an instance of every role (e.g. "actor_rollout", "critic").

    Each role's registered method `m` is exposed as `<role>_m`; `RayWorkerGroup.spawn(roles)` then gives a
    group per role. All roles of a rank share one process, so one device per rank serves every role.
    """
    role_classes = {role: cia.user_cls for role, cia in class_dict.items()}
    init_args = {role: (cia.args, cia.kwargs) for role, cia in class_dict.items()}

    class WorkerDict(Worker):
        def __init__(self):
            super().__init__()
            self.worker_dict = {role: cls(*init_args[role][0], **init_args[role][1]) for role, cls in role_classes.items()}

    WorkerDict.role_classes = role_classes
    for role, cls in role_classes.items():
        for name, attrs in registered_methods(cls).items():
            forward = _role_forwarder(role, name, inspect.iscoroutinefunction(getattr(cls, name)))
            setattr(forward, MAGIC_ATTR, attrs)  # the colocated group also gets `<role>_<name>` methods
            setattr(WorkerDict, f"{role}_{name}", forward)
    WorkerDict.__name__ = WorkerDict.__qualname__ = "WorkerDict_" + "_".join(role_classes)
    return RayClassWithInitArgs(WorkerDict)


def create_colocated_worker_raw_cls(class_dict: dict[str, RayClassWithInitArgs]) -> type:
    """The colocated worker as a plain class to subclass (upstream's "fused" worker): it holds an instance of
    every role, reachable as `self.<role>` (and through `fused_worker_dict`, which each role instance also gets,
    so roles can reach each other), and exposes each role's registered method `m` as `<role>_m`. A subclass can
    add registered methods that combine the roles in one call; build its group, then `group.fuse(roles)` (or
    `spawn`) for per-role groups."""
    role_classes = {role: cia.user_cls for role, cia in class_dict.items()}
    init_args = {role: (cia.args, cia.kwargs) for role, cia in class_dict.items()}

    class FusedWorker(Worker):
        def __init__(self):
            super().__init__()
            self.worker_dict = {}
            for role, cls in role_classes.items():
                self.worker_dict[role] = cls(*init_args[role][0], **init_args[role][1])
                setattr(self, role, self.worker_dict[role])
            self.fused_worker_dict = self.worker_dict
            for instance in self.worker_dict.values():
                instance.fused_worker_dict = self.worker_dict

    FusedWorker.role_classes = FusedWorker.raw_cls_dict = role_classes
    FusedWorker.is_fused_worker = True
    for role, cls in role_classes.items():
        for name, attrs in registered_methods(cls).items():
            forward = _role_forwarder(role, name, inspect.iscoroutinefunction(getattr(cls, name)))
            setattr(forward, MAGIC_ATTR, attrs)
            setattr(FusedWorker, f"{role}_{name}", forward)
    FusedWorker.__name__ = FusedWorker.__qualname__ = "FusedWorker_" + "_".join(role_classes)
    return FusedWorker


def create_colocated_worker_cls_fused(class_dict: dict[str, RayClassWithInitArgs]) -> RayClassWithInitArgs:
    """`create_colocated_worker_raw_cls` ready to build a worker group from."""
    cia = RayClassWithInitArgs(create_colocated_worker_raw_cls(class_dict))
    cia.fused_worker_used = True
    return cia


def _role_forwarder(role: str, name: str, is_async: bool = False):
    if is_async:
        async def forward(self, *args, **kwargs):
            return await getattr(self.worker_dict[role], name)(*args, **kwargs)
    else:
        def forward(self, *args, **kwargs):
            return getattr(self.worker_dict[role], name)(*args, **kwargs)

    forward.__name__ = f"{role}_{name}"
    return forward
