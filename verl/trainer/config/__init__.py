"""Hydra configs for the trainer (a package so Hydra can find them when main_ppo is imported, not run),
and the typed `algorithm` section upstream code imports from here."""
from .algorithm import AlgoConfig, KLControlConfig

__all__ = ["AlgoConfig", "KLControlConfig"]
