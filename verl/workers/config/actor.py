"""The actor section (`actor_rollout_ref.actor`) typed, with its policy-loss, optimizer, engine and checkpoint
subsections."""
from __future__ import annotations

from verl.base_config import BaseConfig
from verl.trainer.config.config import CheckpointConfig
from verl.utils.config_sections import section_class, unsupported_class
from verl.workers.config.engine import FSDPEngineConfig
from verl.workers.config.optimizer import FSDPOptimizerConfig, OptimizerConfig

__all__ = ["PolicyLossConfig", "RouterReplayConfig", "ActorConfig", "FSDPActorConfig", "McoreActorConfig",
           "VeOmniActorConfig", "QATConfig", "TorchTitanActorConfig"]

PolicyLossConfig = section_class("PolicyLossConfig", "actor_rollout_ref.actor.policy_loss", module=__name__,
                                 doc="`actor.policy_loss`: the loss mode and its mode-specific coefficients.")
ActorConfig = section_class(
    "ActorConfig", "actor_rollout_ref.actor", nested={"policy_loss": PolicyLossConfig, "optim": OptimizerConfig,
                                                     "checkpoint": CheckpointConfig},
    mutable=("ppo_mini_batch_size", "ppo_micro_batch_size", "ppo_micro_batch_size_per_gpu", "ppo_infer_micro_batch_size_per_gpu"),
    module=__name__, doc="`actor_rollout_ref.actor`: batch sizes, clipping, KL and entropy terms, epochs.")
FSDPActorConfig = section_class("FSDPActorConfig", "actor_rollout_ref.actor", (ActorConfig,),
                                nested={"optim": FSDPOptimizerConfig, "fsdp_config": FSDPEngineConfig},
                                module=__name__, doc="The actor section as the FSDP actor reads it.")
RouterReplayConfig = unsupported_class("RouterReplayConfig", BaseConfig, "MoE router replay", __name__)
QATConfig = unsupported_class("QATConfig", BaseConfig, "quantization-aware training", __name__)
McoreActorConfig = unsupported_class("McoreActorConfig", ActorConfig, "the Megatron actor", __name__)
VeOmniActorConfig = unsupported_class("VeOmniActorConfig", ActorConfig, "the VeOmni actor", __name__)
TorchTitanActorConfig = unsupported_class("TorchTitanActorConfig", ActorConfig, "the TorchTitan actor", __name__)
