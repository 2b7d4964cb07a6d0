"""Console logging helpers under upstream's path."""
from verl.utils.logger.aggregate_logger import (
    DecoratorLoggerBase,
    LocalLogger,
    log_with_rank,
    print_rank_0,
    print_with_rank,
    print_with_rank_and_timer,
)

__all__ = ["LocalLogger", "DecoratorLoggerBase", "print_rank_0", "print_with_rank", "print_with_rank_and_timer",
           "log_with_rank"]
