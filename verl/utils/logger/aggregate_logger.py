"""Rank-aware printing and a console logger (upstream's `verl.utils.logger.aggregate_logger`)."""
from __future__ import annotations

import datetime
import logging
import numbers

__all__ = ["concat_dict_to_str", "LocalLogger", "DecoratorLoggerBase", "print_rank_0", "print_with_rank",
           "print_with_rank_and_timer", "log_with_rank"]


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def concat_dict_to_str(dict: dict, step) -> str:  # noqa: A002 - upstream's parameter name
    """"step:N - key:value - ..." with numbers printed to three decimals."""
    parts = [f"step:{step}"]
    for key, value in dict.items():
        parts.append(f"{key}:{value:.3f}" if isinstance(value, numbers.Number) else f"{key}:{value}")
    return " - ".join(parts)


class LocalLogger:
    """Prints metrics to the console (`print_to_console`)."""

    def __init__(self, print_to_console: bool = True):
        self.print_to_console = print_to_console

    def flush(self) -> None:
        return None

    def log(self, data: dict, step) -> None:
        if self.print_to_console:
            print(concat_dict_to_str(data, step=step), flush=True)


class DecoratorLoggerBase:
    """Base of logging decorators: logs through `logger` (or prints) on rank 0 only when asked."""

    def __init__(self, role: str, logger: logging.Logger = None, level=logging.DEBUG, rank: int = 0,
                 log_only_rank_0: bool = True):
        self.role, self.logger, self.level, self.rank = role, logger, level, rank
        self.log_only_rank_0 = log_only_rank_0
        self.logging_function = self.log_by_logging if logger is not None else self.log_by_print

    def log_by_print(self, log_str: str) -> None:
        if not self.log_only_rank_0 or self.rank == 0:
            print(f"{self.role} {log_str}", flush=True)

    def log_by_logging(self, log_str: str) -> None:
        if not self.log_only_rank_0 or self.rank == 0:
            self.logger.log(self.level, f"{self.role} {log_str}")


def print_rank_0(message) -> None:
    if _rank() == 0:
        print(message, flush=True)


def print_with_rank(message: str, rank: int = 0, log_only_rank_0: bool = False) -> None:
    if not log_only_rank_0 or rank == 0:
        print(f"[Rank {rank}] {message}", flush=True)


def print_with_rank_and_timer(message: str, rank: int = 0, log_only_rank_0: bool = False) -> None:
    if not log_only_rank_0 or rank == 0:
        print(f"[{datetime.datetime.now().strftime('%Y-%m-%d %H:%M:%S')}] [Rank {rank}] {message}", flush=True)


def log_with_rank(message: str, rank, logger: logging.Logger, level=logging.INFO, log_only_rank_0: bool = False):
    if not log_only_rank_0 or rank == 0:
        logger.log(level, f"[Rank {rank}] {message}")
