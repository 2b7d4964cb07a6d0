"""The critic section (`critic`) typed, with its model, optimizer, engine and checkpoint subsections."""
from __future__ import annotations

from verl.trainer.config.config import BaseModelConfig, CheckpointConfig
from verl.utils.config_sections import section_class, unsupported_class
from verl.workers.config.engine import FSDPEngineConfig
from verl.workers.config.optimizer import FSDPOptimizerConfig, OptimizerConfig

__all__ = ["CriticConfig", "FSDPCriticConfig", "McoreCriticConfig", "TorchTitanCriticConfig", "FSDPCriticModelCfg",
           "VeOmniCriticConfig"]

FSDPCriticModelCfg = section_class("FSDPCriticModelCfg", "critic.model", (BaseModelConfig,), module=__name__,
                                   doc="`critic.model`: the value model's path, tokenizer and overrides.")
CriticConfig = section_class(
    "CriticConfig", "critic", nested={"optim": OptimizerConfig, "checkpoint": CheckpointConfig},
    mutable=("ppo_mini_batch_size", "ppo_micro_batch_size", "ppo_micro_batch_size_per_gpu"),
    module=__name__, doc="`critic`: batch sizes, value clipping, epochs.")
FSDPCriticConfig = section_class("FSDPCriticConfig", "critic", (CriticConfig,),
                                 nested={"optim": FSDPOptimizerConfig, "fsdp": FSDPEngineConfig,
                                         "model": FSDPCriticModelCfg},
                                 module=__name__, doc="The critic section as the FSDP critic reads it.")
McoreCriticConfig = unsupported_class("McoreCriticConfig", CriticConfig, "the Megatron critic", __name__)
TorchTitanCriticConfig = unsupported_class("TorchTitanCriticConfig", CriticConfig, "the TorchTitan critic", __name__)
VeOmniCriticConfig = unsupported_class("VeOmniCriticConfig", CriticConfig, "the VeOmni critic", __name__)
