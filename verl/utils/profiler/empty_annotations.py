"""Range marks that record nothing (upstream's fallback when no profiler package is installed)."""
from __future__ import annotations

from typing import Callable, Optional

__all__ = ["mark_start_range", "mark_end_range", "mark_annotate"]


def mark_start_range(message: Optional[str] = None, color: Optional[str] = None, domain: Optional[str] = None,
                     category: Optional[str] = None) -> None:
    return None


def mark_end_range(range_id: str) -> None:
    return None


def mark_annotate(message: Optional[str] = None, color: Optional[str] = None, domain: Optional[str] = None,
                  category: Optional[str] = None) -> Callable:
    """A decorator that leaves the function unchanged."""
    return lambda func: func
