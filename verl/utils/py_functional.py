"""Small Python helpers upstream code imports (`verl.utils.py_functional`)."""
from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from contextlib import contextmanager
from functools import wraps
from types import SimpleNamespace
from typing import Any, Callable, Optional

__all__ = ["timeout_limit", "union_two_dict", "rename_dict", "append_to_dict", "NestedNamespace", "DynamicEnumMeta",
           "DynamicEnum", "temp_env_var", "convert_to_regular_types", "convert_nested_value_to_list_recursive",
           "list_of_dict_to_dict_of_list"]


def _child(queue, func, args, kwargs):
    try:
        queue.put((True, func(*args, **kwargs)))
    except BaseException as exc:  # handed back to the caller
        queue.put((False, exc))


def timeout_limit(seconds: float, use_signals: bool = False):
    """Decorator: the call raises TimeoutError after `seconds`. With `use_signals` it runs in this process under
    SIGALRM (main thread only); otherwise in a child process that is killed at the limit (the function and its
    result must pickle)."""

    def decorate(func: Callable):
        @wraps(func)
        def run(*args, **kwargs):
            if use_signals:
                if threading.current_thread() is not threading.main_thread():
                    raise RuntimeError("timeout_limit(use_signals=True) works in the main thread only")

                def expire(*_):
                    raise TimeoutError(f"{func.__name__} timed out after {seconds} s")

                previous = signal.signal(signal.SIGALRM, expire)
                signal.setitimer(signal.ITIMER_REAL, seconds)
                try:
                    return func(*args, **kwargs)
                finally:
                    signal.setitimer(signal.ITIMER_REAL, 0)
                    signal.signal(signal.SIGALRM, previous)
            queue = multiprocessing.Queue()
            proc = multiprocessing.Process(target=_child, args=(queue, func, args, kwargs), daemon=True)
            proc.start()
            proc.join(seconds)
            if proc.is_alive():
                proc.kill()
                proc.join()
                raise TimeoutError(f"{func.__name__} timed out after {seconds} s")
            if queue.empty():
                raise RuntimeError(f"{func.__name__} ended (exit code {proc.exitcode}) without a result")
            ok, value = queue.get()
            if not ok:
                raise value
            return value

        return run

    return decorate


def union_two_dict(dict1: dict, dict2: dict) -> dict:
    """`dict1` updated with `dict2` in place; a key both hold with unequal values is an error."""
    for key, value in dict2.items():
        if key in dict1 and dict1[key] != value:
            raise AssertionError(f"{key} in meta_dict1 and meta_dict2 are not the same object")
        dict1[key] = value
    return dict1


def rename_dict(data: dict, prefix: str = "") -> dict:
    """A copy with `prefix` put in front of every key that does not already start with it."""
    return {(key if key.startswith(prefix) else f"{prefix}{key}"): value for key, value in data.items()}


def append_to_dict(data: dict, new_data: dict, prefix: str = "") -> None:
    """Collect `new_data`'s values into lists (or Metrics) in `data`; keys prefixed as `rename_dict` does, lists
    extend."""
    for key, value in rename_dict(new_data, prefix).items():
        if key not in data:  # a Metric starts an empty Metric of its kind, anything else a list
            data[key] = value.init_list() if hasattr(value, "init_list") else []
        bucket = data[key]
        bucket.extend(value) if isinstance(value, list) else bucket.append(value)


class NestedNamespace(SimpleNamespace):
    """A SimpleNamespace over a dict whose nested dicts become namespaces too (`ns.a.b`)."""

    def __init__(self, dictionary: dict, **kwargs):
        super().__init__(**kwargs)
        for key, value in dictionary.items():
            setattr(self, key, NestedNamespace(value) if isinstance(value, dict) else value)


class DynamicEnumMeta(type):
    """Iteration, membership (by name or member), `Cls[name]`, `names()` and `values()` over the registry."""

    def __iter__(cls):
        return iter(cls._registry.values())

    def __contains__(cls, item) -> bool:
        return item in cls._registry if isinstance(item, str) else item in cls._registry.values()

    def __getitem__(cls, name: str):
        return cls._registry[name]

    def names(cls) -> list[str]:
        return list(cls._registry)

    def values(cls) -> list:
        return list(cls._registry.values())


class DynamicEnum(metaclass=DynamicEnumMeta):
    """An enum that plugins extend at run time: `register(name)` adds an upper-cased member numbered in order.
    Subclasses must declare their own `_registry = {}` and `_next_value = 0`."""

    _registry: dict[str, "DynamicEnum"] = {}
    _next_value: int = 0

    def __init__(self, name: str, value: int):
        self.name, self.value = name, value

    def __repr__(self) -> str:
        return f"<{type(self).__name__}.{self.name}: {self.value}>"

    def __reduce__(self):  # unpickles to the registered member, not a copy
        return getattr, (type(self), self.name)

    @classmethod
    def register(cls, name: str) -> "DynamicEnum":
        key = name.upper()
        if key in cls._registry:
            raise ValueError(f"{key} already registered")
        member = cls(key, cls._next_value)
        cls._registry[key] = member
        setattr(cls, key, member)
        cls._next_value += 1
        return member

    @classmethod
    def remove(cls, name: str) -> "DynamicEnum":
        key = name.upper()
        member = cls._registry.pop(key)
        delattr(cls, key)
        return member

    @classmethod
    def from_name(cls, name: str) -> Optional["DynamicEnum"]:
        return cls._registry.get(name.upper())


@contextmanager
def temp_env_var(key: str, value: str):
    """Set an environment variable for the block, then restore (or remove) it."""
    before = os.environ.get(key)
    os.environ[key] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = before


def convert_to_regular_types(obj: Any) -> Any:
    """OmegaConf containers (and lists/tuples/dicts holding them) as plain Python lists and dicts."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(obj, (DictConfig, ListConfig)):
        return OmegaConf.to_container(obj, resolve=True)
    if isinstance(obj, (list, tuple)):
        return type(obj)(convert_to_regular_types(x) for x in obj)
    if isinstance(obj, dict):
        return {k: convert_to_regular_types(v) for k, v in obj.items()}
    return obj


def convert_nested_value_to_list_recursive(data_item: Any) -> Any:
    """numpy arrays inside dicts and lists turned into (nested) lists; other values unchanged."""
    import numpy as np

    if isinstance(data_item, np.ndarray):
        data_item = data_item.tolist()
    if isinstance(data_item, dict):
        return {k: convert_nested_value_to_list_recursive(v) for k, v in data_item.items()}
    if isinstance(data_item, list):
        return [convert_nested_value_to_list_recursive(v) for v in data_item]
    return data_item


def list_of_dict_to_dict_of_list(list_of_dict: list[dict]) -> dict:
    """[{a: 1, b: 2}, {a: 3, b: 4}] -> {a: [1, 3], b: [2, 4]} (keys of the first dict)."""
    if not list_of_dict:
        return {}
    return {key: [item[key] for item in list_of_dict] for key in list_of_dict[0]}
