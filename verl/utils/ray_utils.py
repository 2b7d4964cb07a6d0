"""Ray helpers upstream code imports (`verl.utils.ray_utils`)."""
from __future__ import annotations

import asyncio
import functools
import inspect
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional

__all__ = ["ray_noset_visible_devices", "parallel_put", "get_event_loop", "auto_await"]

_NOSET_VARS = ("RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES", "RAY_EXPERIMENTAL_NOSET_ROCR_VISIBLE_DEVICES",
               "RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES", "RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES")


def ray_noset_visible_devices(env_vars=os.environ) -> bool:
    """Whether Ray was told to leave the *_VISIBLE_DEVICES variables alone."""
    return any(env_vars.get(name) for name in _NOSET_VARS)


def parallel_put(data_list: list[Any], max_workers: Optional[int] = None) -> list:
    """`ray.put` each item from a thread pool (at most 16 threads by default); the refs in input order."""
    import ray

    assert len(data_list) > 0, "parallel_put needs at least one item"
    workers = max(1, min(len(data_list), max_workers or 16))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(ray.put, data_list))


def get_event_loop() -> asyncio.AbstractEventLoop:
    """The running loop, else this thread's loop (a new one set when there is none)."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        pass
    try:
        loop = asyncio.get_event_loop_policy().get_event_loop()
    except RuntimeError:
        loop = None
    if loop is None or loop.is_closed():
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
    return loop


def auto_await(func):
    """An async function that, called outside a running loop, runs to completion and returns its result;
    inside a loop it returns the coroutine for the caller to await."""
    if not inspect.iscoroutinefunction(func):
        return func

    @functools.wraps(func)
    def call(*args, **kwargs):
        coro = func(*args, **kwargs)
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return get_event_loop().run_until_complete(coro)
        return coro

    return call
