"""Backend-specific checkpoint sections (Megatron's is not supported here)."""
from verl.trainer.config.config import CheckpointConfig
from verl.utils.config_sections import unsupported_class

__all__ = ["McoreCheckpointConfig"]

McoreCheckpointConfig = unsupported_class("McoreCheckpointConfig", CheckpointConfig, "Megatron checkpoints", __name__)
