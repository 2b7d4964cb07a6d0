"""Ray backend of the single controller."""

from .base import (
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

__all__ = [
    "RayClassWithInitArgs",
    "RayResourcePool",
    "RayWorkerGroup",
    "ResourcePoolManager",
    "ResourceUnavailableError",
    "WorkerDiedError",
    "WorkerError",
    "WorkerGroupTimeoutError",
    "create_colocated_worker_cls",
]
