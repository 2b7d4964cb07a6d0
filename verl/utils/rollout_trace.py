"""Rollout tracing hooks (upstream's `verl.utils.rollout_trace`). Tracing backends (weave, mlflow, trackio) are
not supported here: with no backend configured, which is upstream's default, the decorator and the context
manager leave the traced code unchanged; configuring a backend raises NotImplementedError."""
from __future__ import annotations

import contextlib
import functools
import inspect

__all__ = ["RolloutTraceConfig", "rollout_trace_attr", "rollout_trace_op"]


class RolloutTraceConfig:
    """Process-wide tracing settings (one instance); `backend` stays None in this verl."""

    _instance = None
    backend = None
    client = None
    token2text = False
    project_name = None
    experiment_name = None
    max_samples_per_step_per_worker = None

    def __new__(cls, *args, **kwargs):
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    @classmethod
    def get_instance(cls) -> "RolloutTraceConfig":
        return cls()

    @classmethod
    def init(cls, project_name: str, experiment_name: str, backend: str, token2text: bool = False,
             max_samples_per_step_per_worker: int | None = None):
        if backend:
            raise NotImplementedError(f"rollout tracing with backend={backend!r} is not supported by this verl; "
                                      "set actor_rollout_ref.rollout.trace.backend=null")
        config = cls.get_instance()
        config.project_name, config.experiment_name = project_name, experiment_name
        config.token2text, config.max_samples_per_step_per_worker = token2text, max_samples_per_step_per_worker

    @classmethod
    def get_backend(cls):
        return cls.get_instance().backend

    @classmethod
    def get_client(cls):
        return cls.get_instance().client

    @classmethod
    def enable_token2text(cls):
        return cls.get_instance().token2text

    @classmethod
    def reset(cls):
        cls._instance = None


@contextlib.contextmanager
def rollout_trace_attr(sample_index=None, step=None, rollout_n=None, name="rollout_trace", validate=False,
                       trace: bool = True):
    """Attributes for the enclosed trace span; without a backend, nothing to record."""
    yield


def rollout_trace_op(func):
    """Marks a method whose calls a tracing backend would record; without a backend, the method unchanged."""
    if inspect.iscoroutinefunction(func):
        @functools.wraps(func)
        async def run_async(self, *args, **kwargs):
            return await func(self, *args, **kwargs)

        return run_async

    @functools.wraps(func)
    def run(self, *args, **kwargs):
        return func(self, *args, **kwargs)

    return run
