"""Single controller: one driver process steering groups of worker processes (see docs/single_controller.md)."""

from .base import ClassWithInitArgs, ResourcePool, Worker, WorkerGroup

__all__ = ["Worker", "WorkerGroup", "ClassWithInitArgs", "ResourcePool"]
