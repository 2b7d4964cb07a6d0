"""Logging set-up helpers (upstream's `verl.utils.logging_utils`)."""
from __future__ import annotations

import logging
import os
import sys

__all__ = ["configure_verl_logging", "set_basic_config", "log_to_file"]

_FORMAT = "%(levelname)s:%(asctime)s:%(message)s"


def configure_verl_logging() -> None:
    """Give the `verl` logger its own stderr handler at VERL_LOGGING_LEVEL (default INFO), not propagating, so
    changes to the root logger by other libraries do not silence or duplicate verl's messages."""
    level = os.getenv("VERL_LOGGING_LEVEL", "INFO")
    handler = logging.StreamHandler(stream=sys.stderr)
    handler.setLevel(level)
    handler.setFormatter(logging.Formatter(_FORMAT))
    logger = logging.getLogger("verl")
    logger.handlers = [handler]
    logger.setLevel(level)
    logger.propagate = False


def set_basic_config(level) -> None:
    """The root logger's format and level."""
    logging.basicConfig(format=_FORMAT, level=level)


def log_to_file(string: str) -> None:
    """Print `string`, and append it to logs/log_<rank> when a `logs` folder exists."""
    print(string)
    if os.path.isdir("logs"):
        import torch.distributed as dist

        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        with open(f"logs/log_{rank}", "a+") as handle:
            handle.write(string + "\n")
