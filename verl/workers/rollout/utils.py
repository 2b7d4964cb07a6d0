"""Upstream's `verl.workers.rollout.utils`: `get_max_position_embeddings` and `ensure_async_iterator` work; the
rest serves upstream's HTTP rollout servers (uvicorn, Prometheus, vision-token dedup for vLLM servers), which this
verl does not run, and raises NotImplementedError."""
from __future__ import annotations

from verl._unsupported import stand_in

__all__ = ["ensure_async_iterator", "get_max_position_embeddings"]

__getattr__ = stand_in(__name__, "upstream's HTTP rollout servers (this verl's rollout runs inside the rollout worker)")


def get_max_position_embeddings(hf_config) -> int:
    """The model's context length, from its config or (vision-language models) its text config."""
    for config in (hf_config, getattr(hf_config, "text_config", None)):
        value = getattr(config, "max_position_embeddings", None) if config is not None else None
        if value is not None:
            return int(value)
    raise ValueError("the model config has no max_position_embeddings (nor text_config.max_position_embeddings)")


async def ensure_async_iterator(iterable):
    """Iterate a sync or an async iterable with `async for`."""
    if hasattr(iterable, "__aiter__"):
        async for item in iterable:
            yield item
    else:
        for item in iterable:
            yield item
