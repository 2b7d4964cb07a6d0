"""nd dispatch on a real Ray worker group: workers register their data-parallel rank in a named mesh, a method
registered with make_nd_compute_dataproto_dispatch_fn gets its rank's chunk (two workers per rank here, like
tensor-parallel peers), and one worker per rank answers."""
import sys

import numpy as np
import pytest
import torch
from ray import cloudpickle

try:
    import tensordict  # optional (verl[tensordict]): without it the TensorDict dispatch is not checked
except ImportError:
    tensordict = None

from verl.protocol import DataProto
from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import make_nd_compute_dataproto_dispatch_fn, register
from verl.single_controller.ray.base import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup

# the worker class lives in a test module the workers cannot import: ship it by value
cloudpickle.register_pickle_by_value(sys.modules[__name__])


class MeshWorker(Worker):
    def __init__(self):
        super().__init__()
        # 4 workers = 2 data-parallel ranks x 2 peers; the first peer of each rank answers
        self._register_dispatch_collect_info("actor", dp_rank=self.rank // 2, is_collect=self.rank % 2 == 0)

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("actor"))
    def tag(self, data: DataProto) -> DataProto:
        out = data.batch["x"] * 10 + self.rank
        return DataProto.from_dict(tensors={"y": out})

    @register(dispatch_mode=make_nd_compute_dataproto_dispatch_fn("actor"))
    def tag_td(self, data):
        """Upstream's newer workers take and return TensorDicts, with jagged rows."""
        from verl.utils import tensordict_utils as tu

        lengths = [len(row) for row in data["ids"].unbind(0)]
        return tu.get_tensordict({"y": data["x"] * 10 + self.rank, "lengths": lengths}, {"rank": self.rank})

    def local_env(self):
        import os

        return os.environ["RAY_LOCAL_RANK"], os.environ["RAY_LOCAL_WORLD_SIZE"]


@pytest.mark.timeout(120)
def test_nd_dispatch_splits_by_dp_rank_and_collects_one_worker_per_rank(ray_session):
    pool = RayResourcePool([4], use_gpu=False)
    group = RayWorkerGroup(resource_pool=pool, ray_cls_with_init=RayClassWithInitArgs(cls=MeshWorker))
    try:
        assert group._query_dispatch_info("actor") == [0, 0, 1, 1]
        assert group._query_collect_info("actor") == [True, False, True, False]
        out = group.tag(DataProto.from_dict(tensors={"x": torch.arange(4)}))
        # rank 0 (worker 0) got rows 0-1, rank 1 (worker 2) rows 2-3; workers 1 and 3 computed but are not read
        assert out.batch["y"].tolist() == [0, 10, 22, 32]
        if tensordict is not None:  # the same dispatch with a TensorDict holding a jagged tensor
            from verl.utils import tensordict_utils as tu

            ids = torch.nested.as_nested_tensor([torch.arange(n) for n in (1, 2, 3, 4)], layout=torch.jagged)
            td_out = group.tag_td(tu.get_tensordict({"x": torch.arange(4), "ids": ids}))
            assert td_out["y"].tolist() == [0, 10, 22, 32]
            assert tu.get(td_out, "lengths") == [1, 2, 3, 4]
            assert tu.get(td_out, "rank") == 0  # batch-wide values: the first part's
        envs = group.execute_all_sync("local_env")
        assert sorted(envs) == [("0", "4"), ("1", "4"), ("2", "4"), ("3", "4")]
    finally:
        group.shutdown()
        pool.release()            # the session's Ray is shared: give its CPUs back to the tests after this one


def test_registering_a_mesh_twice_is_an_error():
    worker = Worker()
    worker._register_dispatch_collect_info("ref", 0, True)
    with pytest.raises(ValueError, match="already registered"):
        worker._register_dispatch_collect_info("ref", 1, False)
    other = Worker()
    other.set_dispatch_collect("ref", **worker.get_dispatch_collect())
    assert other._query_dispatch_info("ref") == 0 and other._query_collect_info("ref") is True
    np.testing.assert_equal(sorted(other.get_dispatch_collect()), ["collect_dp_rank", "dispatch_dp_rank"])
