"""Fused workers: a subclass of create_colocated_worker_raw_cls combines two roles inside one process in one
call, and fuse() gives per-role groups over the same actors."""
import sys

import pytest
from ray import cloudpickle

from verl.single_controller.base import Worker
from verl.single_controller.base.decorator import Dispatch, register
from verl.single_controller.ray.base import (
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    create_colocated_worker_raw_cls,
)

cloudpickle.register_pickle_by_value(sys.modules[__name__])


class Doubler(Worker):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def double(self, x):
        return 2 * x + self.rank


class Shifter(Worker):
    def __init__(self, by):
        super().__init__()
        self.by = by

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def shift(self, x):
        # a role reaches its sibling through fused_worker_dict
        return x - self.by + 0 * self.fused_worker_dict["double"].double(0)


ROLES = {"double": RayClassWithInitArgs(cls=Doubler), "shift": RayClassWithInitArgs(cls=Shifter, by=5)}


class Both(create_colocated_worker_raw_cls(ROLES)):
    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def both(self, x):
        return self.shift.shift(self.double.double(x))


@pytest.mark.timeout(120)
def test_fused_group_calls_roles_alone_and_together(ray_session):
    pool = RayResourcePool([2], use_gpu=False)
    group = RayWorkerGroup(resource_pool=pool, ray_cls_with_init=RayClassWithInitArgs(cls=Both))
    try:
        group.fuse(ROLES.keys())
        assert group.double.double(1) == [2, 3]               # rank 0 and rank 1
        assert group.shift.shift(10) == [5, 5]
        assert group.both(1) == [-3, -2]                      # (2*1 + rank) - 5, in one call per worker
        assert group.double_double(1) == [2, 3]               # the prefixed names on the fused group itself
    finally:
        group.shutdown()
        pool.release()            # the session's Ray is shared: give its CPUs back to the tests after this one
