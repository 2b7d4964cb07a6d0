"""`trainer.checkpoint_callback_class`: a driver-side hook run after each complete checkpoint save.

The trainer builds the named class with the whole config and calls `on_save` once the step folder, its
manifest and the tracker are on disk, so a callback may upload or register the checkpoint as durable. An
exception from the hook stops training: a lost upload should not go unnoticed.
"""
from __future__ import annotations

from verl.utils.import_utils import load_class_from_fqn

__all__ = ["CheckpointCallback", "build_checkpoint_callback"]


class CheckpointCallback:
    """Does nothing; subclass it and override `on_save` (keep `**kwargs`: later versions may pass more)."""

    def __init__(self, config=None):
        self.config = config

    def on_save(self, trainer, global_step: int, checkpoint_dir: str, async_save: bool = False, **kwargs) -> None:
        """Called with the `global_step_<N>` folder just written (this verl saves synchronously)."""


def build_checkpoint_callback(config) -> CheckpointCallback:
    """The callback `config.trainer.checkpoint_callback_class` names, or the no-op one when it is unset."""
    name = (config.trainer.get("checkpoint_callback_class", None) if "trainer" in config else None)
    if not name:
        return CheckpointCallback(config=config)
    return load_class_from_fqn(name, "trainer.checkpoint_callback_class")(config=config)
