"""Ray backend of the single controller."""

from .base import (
    RayClassWithInitArgs,
    RayResourcePool,
    RayWorkerGroup,
    ResourcePoolManager,
    ResourceUnavailableError,
    SubRayResourcePool,
    WorkerDiedError,
    WorkerError,
    WorkerGroupTimeoutError,
    create_colocated_worker_cls,
    create_colocated_worker_cls_fused,
    create_colocated_worker_raw_cls,
    merge_resource_pool,
    split_resource_pool,
)

__all__ = [
    "RayClassWithInitArgs",
    "RayResourcePool",
    "RayWorkerGroup",
    "ResourcePoolManager",
    "ResourceUnavailableError",
    "SubRayResourcePool",
    "WorkerDiedError",
    "WorkerError",
    "WorkerGroupTimeoutError",
    "create_colocated_worker_cls",
    "create_colocated_worker_cls_fused",
    "create_colocated_worker_raw_cls",
    "merge_resource_pool",
    "split_resource_pool",
]
