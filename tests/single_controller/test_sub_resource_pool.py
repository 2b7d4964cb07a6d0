"""Views of part of a resource pool: split_resource_pool / merge_resource_pool with real worker groups on CPU."""

import os
import sys
import time

import pytest
import ray
import torch
import torch.distributed as dist
from ray import cloudpickle

from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, register
from verl.single_controller.ray import (
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    SubRayResourcePool,
    merge_resource_pool,
    split_resource_pool,
)

cloudpickle.register_pickle_by_value(sys.modules[__name__])


class WhereWorker(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def where(self):
        import ray

        keys = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "RAY_LOCAL_RANK", "RAY_LOCAL_WORLD_SIZE"]
        return {"pg": ray.get_runtime_context().get_placement_group_id(), **{k: int(os.environ[k]) for k in keys}}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def all_reduce_rank(self):
        dist.init_process_group("gloo")
        try:
            value = torch.tensor([float(self.rank + 1)])
            dist.all_reduce(value)
            return value.item()
        finally:
            dist.destroy_process_group()


def _bundle_use(pg, expected, timeout_s=20.0):
    """CPU taken from each bundle of `pg`, as Ray's own accounting reports it (it lags actor start a little)."""
    deadline = time.monotonic() + timeout_s
    while True:
        free = ray.available_resources()
        used = [round(1 - free.get(f"CPU_group_{b}_{pg.id.hex()}", 0.0), 3) for b in range(pg.bundle_count)]
        if used == expected or time.monotonic() > deadline:
            return used
        time.sleep(0.2)


def _group(pool):
    return RayWorkerGroup(resource_pool=pool, ray_cls_with_init=RayClassWithInitArgs(WhereWorker), timeout_s=45)


@pytest.fixture
def pool(ray_session):
    # two actors may share a bundle, so the group on the merged pool fits beside the two on the halves
    pool = RayResourcePool(process_on_nodes=[2], use_gpu=False, max_colocate_count=2)
    yield pool
    pool.release()


def test_two_groups_on_the_two_halves_and_one_on_the_merge(pool):
    first, second = split_resource_pool(pool, 1)
    assert isinstance(first, SubRayResourcePool) and first.pgs == pool.pgs
    assert (first.start_bundle_index, first.world_size, second.start_bundle_index, second.world_size) == (0, 1, 1, 1)
    pg = pool.pgs[0]

    groups = [_group(first)]
    try:
        # each actor takes half a bundle: the first group sits on bundle 0 only, the second on bundle 1
        assert _bundle_use(pg, [0.5, 0.0]) == [0.5, 0.0]
        groups.append(_group(second))
        assert _bundle_use(pg, [0.5, 0.5]) == [0.5, 0.5]
        placed = [g.where()[0] for g in groups]
        assert all(p["pg"] == pg.id.hex() for p in placed)
        # each group is a world of its own; RAY_LOCAL_* still say where in the node's group the bundle is
        assert [(p["RANK"], p["WORLD_SIZE"], p["LOCAL_RANK"], p["LOCAL_WORLD_SIZE"]) for p in placed] == [(0, 1, 0, 1)] * 2
        assert [(p["RAY_LOCAL_RANK"], p["RAY_LOCAL_WORLD_SIZE"]) for p in placed] == [(0, 2), (1, 2)]

        whole = merge_resource_pool(first, second)
        assert (whole.start_bundle_index, whole.world_size) == (0, 2)
        merged_group = _group(whole)
        try:
            assert _bundle_use(pg, [1.0, 1.0]) == [1.0, 1.0]
            placed = merged_group.where()
            assert [(p["RANK"], p["WORLD_SIZE"], p["LOCAL_RANK"]) for p in placed] == [(0, 2, 0), (1, 2, 1)]
            assert merged_group.all_reduce_rank() == [3.0, 3.0]  # 1 + 2 over gloo: one process group
        finally:
            merged_group.shutdown()
    finally:
        for g in groups:
            g.shutdown()


def test_split_sizes_nesting_and_errors(pool):
    halves = split_resource_pool(pool, [1, 1])
    (again,) = split_resource_pool(halves[1], [1])  # a view splits again, counting from its own start
    assert (again.start_bundle_index, again.world_size) == (1, 1)
    assert [(b, n) for b, n in zip(again.local_rank_list(), again.local_world_size_list())] == [(1, 2)]
    (all_of_it,) = split_resource_pool(pool, 2)
    assert [slot[2] for slot in all_of_it.bundle_slots()] == [0, 1]
    all_of_it.release()  # a view leaves the pool's placement groups alone
    assert pool.pgs is not None

    with pytest.raises(ValueError, match="does not divide"):
        split_resource_pool(pool, 3)
    with pytest.raises(ValueError, match="sum to"):
        split_resource_pool(pool, [1, 2])
    with pytest.raises(ValueError, match="adjacent"):
        merge_resource_pool(halves[1], halves[0])
    with pytest.raises(ValueError, match="not inside"):
        SubRayResourcePool(pool.pgs, start_bundle_index=1, subgroup_world_size=2, use_gpu=False)
    other = RayResourcePool(process_on_nodes=[1], use_gpu=False, max_colocate_count=1)
    with pytest.raises(ValueError, match="max_colocate_count"):
        merge_resource_pool(pool, other)


def test_merging_two_pools_puts_their_groups_side_by_side(ray_session):
    a = RayResourcePool(process_on_nodes=[1], use_gpu=False, max_colocate_count=2, name_prefix="a")
    b = RayResourcePool(process_on_nodes=[1], use_gpu=False, max_colocate_count=2, name_prefix="b")
    try:
        merged = merge_resource_pool(a, b)
        assert type(merged) is RayResourcePool and merged.store == [1, 1] and merged.world_size == 2
        assert [(pg.id, bundle) for _, pg, bundle in merged.bundle_slots()] == [(a.pgs[0].id, 0), (b.pgs[0].id, 0)]
    finally:
        a.release()
        b.release()
