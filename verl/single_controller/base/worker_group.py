"""`WorkerGroup`: the driver-side handle on a set of workers, with their registered methods bound to it.

Backends (Ray, see `verl.single_controller.ray`) implement three things: `execute_all`, `execute_rank_zero`
(start the calls, return futures) and `wait` (resolve futures, with a timeout and the failing rank named).
This module turns each `@register`-ed worker method into a group method on top of them.
"""

from __future__ import annotations

from typing import Any, Callable

from verl.protocol import DataProto, DataProtoFuture, _padding_size_key

from .decorator import MAGIC_ATTR, Execute, get_dispatch_fns


class ResourcePool:
    """How many worker processes go on each node: `process_on_nodes=[4, 4]` is 2 nodes x 4."""

    def __init__(self, process_on_nodes=None, max_colocate_count: int = 10, n_gpus_per_node: int = 8) -> None:
        self._store = list(process_on_nodes or [])
        self.max_colocate_count = max_colocate_count
        self.n_gpus_per_node = n_gpus_per_node

    def add_node(self, process_count: int) -> None:
        self._store.append(process_count)

    @property
    def world_size(self) -> int:
        return sum(self._store)

    @property
    def store(self) -> list[int]:
        return self._store

    def __call__(self) -> list[int]:
        return self._store

    def local_world_size_list(self) -> list[int]:
        """For each rank, the number of processes on its node."""
        return [n for n in self._store for _ in range(n)]

    def local_rank_list(self) -> list[int]:
        """For each rank, its index on its node."""
        return [i for n in self._store for i in range(n)]


class ClassWithInitArgs:
    """A class and its constructor arguments, instantiated later (in another process)."""

    def __init__(self, cls, *args, **kwargs) -> None:
        self.cls = cls
        self.args = args
        self.kwargs = kwargs

    def __call__(self) -> Any:
        return self.cls(*self.args, **self.kwargs)


class _GroupMethod:
    """`group.<name>(...)`: dispatch -> run on the workers -> wait -> collect -> drop padding."""

    def __init__(self, group, name, remote_name, dispatch_fn, collect_fn, execute_mode, blocking):
        self.group, self.__name__, self.remote_name = group, name, remote_name
        self.dispatch_fn, self.collect_fn = dispatch_fn, collect_fn
        self.execute_mode, self.blocking = execute_mode, blocking

    def __call__(self, *args, **kwargs):
        group = self.group
        args, kwargs = self.dispatch_fn(group, *args, **kwargs)
        pad_size = kwargs.pop(_padding_size_key, 0)
        if self.execute_mode is Execute.RANK_ZERO:
            futures = group.execute_rank_zero(self.remote_name, *args, **kwargs)
        else:
            futures = group.execute_all(self.remote_name, *args, **kwargs)
        output = group.wait(futures, self.__name__) if self.blocking else futures
        output = self.collect_fn(group, output)
        if pad_size and isinstance(output, DataProto):
            output = output[: len(output) - pad_size]
        elif pad_size and isinstance(output, DataProtoFuture):
            output.dispatch_fn = _DropLast(pad_size)
        return output

    def __repr__(self) -> str:
        return f"<worker group method {self.__name__}>"


class _DropLast:
    """Picklable `data[:-n]` applied to a DataProtoFuture's result."""

    def __init__(self, n: int):
        self.n = n

    def __call__(self, data: DataProto) -> DataProto:
        return data[: len(data) - self.n]


def registered_methods(cls) -> dict[str, dict]:
    """name -> register() attributes, for every registered method of `cls` (inherited ones included)."""
    found = {}
    for name in dir(cls):
        attrs = getattr(getattr(cls, name, None), MAGIC_ATTR, None)
        if isinstance(attrs, dict):
            found[name] = attrs
    return found


class WorkerGroup:
    """Workers plus their registered methods; see the module docstring for what backends provide."""

    def __init__(self, resource_pool: ResourcePool | None, **kwargs) -> None:
        self._is_init_with_detached_workers = resource_pool is None
        self._process_dispatch_config = resource_pool() if resource_pool is not None else None
        self._workers: list = []
        self._worker_names: list[str] = []
        self._master_addr = None
        self._master_port = None
        # per mesh name: each worker's data-parallel rank / whether its output is collected (nd dispatch)
        self._dispatch_info: dict[str, list[int]] = {}
        self._collect_info: dict[str, list[bool]] = {}

    @property
    def world_size(self) -> int:
        return len(self._workers)

    def _bind_worker_method(self, user_defined_cls, remote_name: Callable[[str], str] = lambda name: name) -> list[str]:
        """Set `self.<name>` for every registered method of the class; returns the names bound.

        `remote_name(name)` is the method to call on the worker (colocated roles add a role prefix).
        """
        bound = []
        for name, attrs in registered_methods(user_defined_cls).items():
            dispatch_fn, collect_fn = get_dispatch_fns(attrs["dispatch_mode"])
            method = _GroupMethod(
                self, name, remote_name(name), dispatch_fn, collect_fn, attrs["execute_mode"], attrs["blocking"]
            )
            setattr(self, name, method)
            bound.append(name)
        return bound

    # ---- backend interface -------------------------------------------------------------------------
    def execute_all(self, method_name: str, *args, **kwargs) -> list:
        raise NotImplementedError

    def execute_rank_zero(self, method_name: str, *args, **kwargs):
        raise NotImplementedError

    def wait(self, futures, method_name: str):
        raise NotImplementedError
