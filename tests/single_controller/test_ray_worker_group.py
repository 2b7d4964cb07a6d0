"""The Ray worker group on two CPU workers: dispatch modes, colocation, errors, timeouts, gloo."""

import os
import sys
import time
from datetime import timedelta

import pytest
import ray
import torch
from ray import cloudpickle

from verl.protocol import DataProto
from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, Execute, register
from verl.single_controller.ray import (
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    ResourcePoolManager,
    ResourceUnavailableError,
    WorkerDiedError,
    WorkerError,
    WorkerGroupTimeoutError,
    create_colocated_worker_cls,
)

# the worker classes below live in a test module the workers cannot import: ship them by value
cloudpickle.register_pickle_by_value(sys.modules[__name__])

# the string comes from a variable, as the plan's dist_backend does in the real workers
DIST_BACKEND = "gloo"


class ToyWorker(Worker):
    def __init__(self, scale=1.0):
        super().__init__()
        self.scale = scale

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def whoami(self, tag):
        return {"rank": self.rank, "world_size": self.world_size, "pid": os.getpid(), "tag": tag}

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def env(self):
        return {k: os.environ.get(k) for k in self.env_keys()}

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def double(self, data: DataProto):
        out = DataProto.from_dict(
            {"y": data.batch["x"] * 2 * self.scale, "rank": torch.full((len(data),), self.rank)},
            meta_info={"metrics": {"rows": len(data)}},
        )
        return out

    @register(dispatch_mode=Dispatch.DP_COMPUTE_METRIC)
    def count(self, data: DataProto):
        return len(data)

    @register(dispatch_mode=Dispatch.DP_COMPUTE)
    def add(self, a, b):
        return a + b

    @register(dispatch_mode=Dispatch.RANK_ZERO)
    def rank_zero_only(self):
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL, execute_mode=Execute.RANK_ZERO)
    def one_to_all_on_rank_zero(self, x):
        return (self.rank, x)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def fail_on(self, bad_rank):
        if self.rank == bad_rank:
            raise ValueError(f"boom from rank {self.rank}")
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def sleep(self, seconds):
        time.sleep(seconds)
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def die_on(self, bad_rank):
        if self.rank == bad_rank:
            os._exit(1)
        time.sleep(30)  # the healthy rank is still busy when its peer dies
        return self.rank

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def peer_dies(self, bad_rank):
        """What a collective does when a peer's machine goes away: the survivor errors first."""
        if self.rank == bad_rank:
            time.sleep(1.0)
            os._exit(1)
        raise ConnectionResetError("Read error: Connection reset by peer")

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def all_reduce(self, backend, value):
        import torch.distributed as dist

        dist.init_process_group(backend=backend, init_method="env://", timeout=timedelta(seconds=60))
        try:
            t = torch.tensor([float(value) * (self.rank + 1)])
            dist.all_reduce(t)
            return t.item()
        finally:
            dist.destroy_process_group()

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, blocking=False)
    def double_async(self, data: DataProto):
        return DataProto.from_dict({"y": data.batch["x"] * 2})


class CriticToy(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def whoami(self, tag):
        return {"rank": self.rank, "pid": os.getpid(), "tag": f"critic:{tag}"}

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def values(self, data: DataProto):
        return DataProto.from_dict({"values": data.batch["x"] + 100})


class FailingInit(Worker):
    def __init__(self):
        super().__init__()
        if self.rank == 1:
            raise RuntimeError("cannot build model on rank 1")

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def ping(self):
        return "pong"


def _cpu_group(cls, n=2, **kwargs):
    pool = RayResourcePool(process_on_nodes=[n], use_gpu=False, max_colocate_count=1)
    return pool, RayWorkerGroup(resource_pool=pool, ray_cls_with_init=RayClassWithInitArgs(cls), timeout_s=60, **kwargs)


@pytest.fixture(scope="module")
def toy_group(ray_session):
    pool, group = _cpu_group(ToyWorker)
    yield group
    group.shutdown()
    pool.release()


def test_env_and_one_to_all(toy_group):
    out = toy_group.whoami("hi")
    assert [o["rank"] for o in out] == [0, 1]
    assert {o["world_size"] for o in out} == {2}
    assert {o["tag"] for o in out} == {"hi"}
    assert out[0]["pid"] != out[1]["pid"]
    envs = toy_group.env()
    assert [e["RANK"] for e in envs] == ["0", "1"]
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1"]
    assert {e["WORLD_SIZE"] for e in envs} == {"2"}
    assert len({(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs}) == 1
    assert envs[0]["MASTER_PORT"] == toy_group.master_port
    assert toy_group.world_size == 2


def test_dp_compute_proto_chunks_and_concats(toy_group):
    data = DataProto.from_dict({"x": torch.arange(6.0)}, meta_info={"step": 3})
    out = toy_group.double(data)
    assert torch.equal(out.batch["y"], torch.arange(6.0) * 2)
    assert out.batch["rank"].tolist() == [0, 0, 0, 1, 1, 1]
    assert out.meta_info["metrics"] == {"rows": [3, 3]}  # one entry per worker


def test_dp_compute_proto_pads_and_unpads(toy_group):
    data = DataProto.from_dict({"x": torch.arange(5.0)}, auto_padding=True)
    out = toy_group.double(data)
    assert len(out) == 5
    assert torch.equal(out.batch["y"], torch.arange(5.0) * 2)
    assert out.meta_info["metrics"] == {"rows": [3, 3]}  # 5 rows padded to 6
    assert len(data) == 5  # the caller's batch is left as it was


def test_dp_compute_proto_uneven_without_padding_names_sizes(toy_group):
    with pytest.raises(ValueError, match="5 samples into 2"):
        toy_group.double(DataProto.from_dict({"x": torch.arange(5.0)}))


def test_metric_dp_compute_and_rank_zero(toy_group):
    assert toy_group.count(DataProto.from_dict({"x": torch.arange(4.0)})) == [2, 2]
    assert toy_group.add([1, 2], [10, 20]) == [11, 22]
    assert toy_group.rank_zero_only() == 0
    assert toy_group.one_to_all_on_rank_zero(7) == (0, 7)
    assert toy_group.execute_all_sync("rank_zero_only") == [0, 1]
    assert toy_group.execute_rank_zero_sync("rank_zero_only") == 0


def test_non_blocking_returns_future_consumed_by_next_call(toy_group):
    data = DataProto.from_dict({"x": torch.arange(4.0)})
    future = toy_group.double_async(data)
    assert not isinstance(future, DataProto)
    assert torch.equal(future.get().batch["y"], torch.arange(4.0) * 2)
    # passed on unresolved, the future is resolved by the receiving workers, each taking its chunk
    assert toy_group.count(toy_group.double_async(data)) == [2, 2]


def test_worker_error_names_rank_and_method(toy_group):
    with pytest.raises(WorkerError) as info:
        toy_group.fail_on(1)
    message = str(info.value)
    assert info.value.rank == 1 and info.value.method == "fail_on"
    assert "rank 1" in message and "fail_on" in message
    assert "ValueError: boom from rank 1" in message
    assert "line" in message and "in fail_on" in message  # the remote traceback
    assert toy_group.whoami("still alive")[1]["rank"] == 1  # the group stays usable


def test_timeout_raises_instead_of_hanging(toy_group):
    toy_group.timeout_s = 1.0
    try:
        with pytest.raises(WorkerGroupTimeoutError, match=r"`sleep`.*1 s.*\[0, 1\].*VERL_RAY_GET_TIMEOUT"):
            toy_group.sleep(4)
    finally:
        toy_group.timeout_s = 60.0
    assert toy_group.sleep(0) == [0, 1]  # queued behind the slow call, then served


def test_dead_worker_raises_clear_error(ray_session):
    pool, group = _cpu_group(ToyWorker)
    try:
        with pytest.raises(WorkerDiedError, match=r"worker rank 1 .*died during `die_on`") as info:
            group.die_on(1)
        assert info.value.rank == 1
    finally:
        group.shutdown()
        pool.release()


def test_survivor_error_after_peer_death_names_the_dead_worker(ray_session):
    pool, group = _cpu_group(ToyWorker)
    try:
        node = ray.get_runtime_context().get_node_id()
        assert group.node_ids == [node, node]                      # reported by the workers themselves
        assert f"node {node} (" in group.describe_placement() and "ranks [0, 1]" in group.describe_placement()
        with pytest.raises(WorkerDiedError) as info:
            group.peer_dies(1)
        message = str(info.value)
        assert info.value.rank == 1 and f"worker rank 1 ({group.worker_names[1]} on node {node}) died" in message
        assert "rank 0 then failed too: ConnectionResetError: Read error: Connection reset by peer" in message
    finally:
        group.shutdown()
        pool.release()


def test_constructor_error_is_reported_at_creation(ray_session):
    pool = RayResourcePool(process_on_nodes=[2], use_gpu=False, max_colocate_count=1)
    try:
        with pytest.raises(WorkerError, match=r"(?s)rank 1 .*failed to start.*cannot build model on rank 1"):
            RayWorkerGroup(resource_pool=pool, ray_cls_with_init=RayClassWithInitArgs(FailingInit))
    finally:
        pool.release()


def test_colocated_roles_share_one_process(ray_session):
    class_dict = {
        "actor_rollout": RayClassWithInitArgs(ray.remote(ToyWorker), scale=10.0),
        "critic": RayClassWithInitArgs(CriticToy),
    }
    pool = RayResourcePool(process_on_nodes=[2], use_gpu=False, max_colocate_count=1)
    group = RayWorkerGroup(resource_pool=pool, ray_cls_with_init=create_colocated_worker_cls(class_dict))
    try:
        roles = group.spawn(prefix_set=class_dict.keys())
        actor, critic = roles["actor_rollout"], roles["critic"]
        a, c = actor.whoami("x"), critic.whoami("x")
        assert [o["pid"] for o in a] == [o["pid"] for o in c]  # same process per rank
        assert len({o["pid"] for o in a}) == 2
        assert [o["tag"] for o in c] == ["critic:x", "critic:x"]
        data = DataProto.from_dict({"x": torch.arange(4.0)})
        assert actor.double(data).batch["y"].tolist() == [0.0, 20.0, 40.0, 60.0]  # init kwargs reached the role
        assert critic.values(data).batch["values"].tolist() == [100.0, 101.0, 102.0, 103.0]
        assert not hasattr(critic, "double")
        assert group.critic_values(data).batch["values"].tolist() == [100.0, 101.0, 102.0, 103.0]
    finally:
        group.shutdown()
        pool.release()


def test_gloo_all_reduce_through_worker_env(toy_group):
    # rank r contributes 3 * (r + 1): 3 + 6
    assert toy_group.all_reduce(DIST_BACKEND, 3.0) == [9.0, 9.0]


def test_cpu_pool_places_one_worker_per_process_count(ray_session):
    pool = RayResourcePool(process_on_nodes=[1], use_gpu=False, max_colocate_count=3)
    try:
        pgs = pool.get_placement_groups()
        assert len(pgs) == 1 and pgs[0].bundle_specs == [{"CPU": 1}]
        assert pool.actor_resources() == {"num_cpus": pytest.approx(1 / 3)}
    finally:
        pool.release()


def test_too_many_gpus_fails_fast_with_advice(ray_session):
    pool = RayResourcePool(process_on_nodes=[2], use_gpu=True)
    with pytest.raises(ResourceUnavailableError, match=r"asks for 2 GPUs.*has 0.*trainer.n_gpus_per_node.*trainer.device=cpu"):
        pool.get_placement_groups()
    manager = ResourcePoolManager(resource_pool_spec={"global_pool": [2]}, mapping={"actor": "global_pool"})
    with pytest.raises(ResourceUnavailableError, match=r"need 2 GPUs.*cluster has 0"):
        manager.create_resource_pool()


def test_placement_timeout_names_the_shortfall(toy_group, monkeypatch):
    # toy_group's two workers hold one CPU bundle each; the holder takes every other CPU
    holder = RayResourcePool(process_on_nodes=[int(ray.cluster_resources()["CPU"]) - 2], use_gpu=False)
    holder.get_placement_groups()
    blocked = RayResourcePool(process_on_nodes=[1], use_gpu=False)
    monkeypatch.setenv("VERL_RAY_PLACEMENT_TIMEOUT", "1")
    try:
        with pytest.raises(ResourceUnavailableError, match=r"could not be placed within 1 s.*free of"):
            blocked.get_placement_groups()
        assert blocked.pgs is None
    finally:
        blocked.release()
        holder.release()


def test_cpu_resource_pool_manager_counts_cpus(ray_session):
    manager = ResourcePoolManager(
        resource_pool_spec={"global_pool": [2]}, mapping={"actor": "global_pool"}, use_gpu=False, max_colocate_count=1
    )
    manager.create_resource_pool()
    pool = manager.get_resource_pool("actor")
    try:
        assert manager.get_n_gpus() == 2
        assert [pg.bundle_specs for pg in pool.get_placement_groups()] == [[{"CPU": 1}, {"CPU": 1}]]
        assert pool.actor_resources() == {"num_cpus": 1.0}
    finally:
        pool.release()


class AsyncToy(Worker):
    """A worker whose registered method is a coroutine (upstream's agent-loop / server workers)."""

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO, blocking=False)
    async def halve(self, data: DataProto):
        import asyncio

        await asyncio.sleep(0.01)   # a real await: the method only finishes if Ray runs it on an event loop
        return DataProto.from_dict({"y": data.batch["x"] / 2, "rank": torch.full((len(data),), self.rank)})

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def ping(self):
        return "pong"


def test_async_method_registered_non_blocking_is_awaited(ray_session):
    pool, group = _cpu_group(AsyncToy)
    try:
        data = DataProto.from_dict({"x": torch.arange(4.0)})
        future = group.halve(data)            # blocking=False: a future, not the result
        assert not isinstance(future, DataProto)
        out = future.get()
        assert out.batch["y"].tolist() == [0.0, 0.5, 1.0, 1.5] and out.batch["rank"].tolist() == [0, 0, 1, 1]
        assert group.ping() == ["pong", "pong"]   # plain methods still work on the async actor
    finally:
        group.shutdown()
        pool.release()

    class_dict = {"rollout": RayClassWithInitArgs(AsyncToy), "critic": RayClassWithInitArgs(CriticToy)}
    pool = RayResourcePool(process_on_nodes=[2], use_gpu=False, max_colocate_count=1)
    group = RayWorkerGroup(resource_pool=pool, ray_cls_with_init=create_colocated_worker_cls(class_dict))
    try:
        rollout = group.spawn(prefix_set=class_dict.keys())["rollout"]
        assert rollout.halve(DataProto.from_dict({"x": torch.arange(4.0)})).get().batch["y"].tolist() == \
            [0.0, 0.5, 1.0, 1.5]
    finally:
        group.shutdown()
        pool.release()
