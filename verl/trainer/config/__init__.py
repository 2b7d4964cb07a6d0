"""Hydra configs for the trainer (a package so Hydra can find them when main_ppo is imported, not run),
and the typed sections upstream code imports from here."""
from . import algorithm, config
from .algorithm import *  # noqa: F401,F403
from .config import *  # noqa: F401,F403

__all__ = config.__all__ + algorithm.__all__
