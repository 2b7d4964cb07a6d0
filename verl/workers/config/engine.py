"""Training-engine sections typed: `fsdp_config` of the actor and ref, `critic.fsdp` (upstream's FSDP engine keys)."""
from __future__ import annotations

from verl.utils.config_sections import section_class, unsupported_class

__all__ = ["FSDPEngineConfig", "McoreEngineConfig", "TrainingWorkerConfig", "TorchtitanEngineConfig",
           "VeOmniEngineConfig", "AutomodelEngineConfig", "EngineConfig", "EngineRouterReplayConfig",
           "QATEngineConfig"]

EngineConfig = section_class("EngineConfig", None, module=__name__,
                             extra={"strategy": "fsdp", "use_dynamic_bsz": False, "infer_micro_batch_size_per_gpu": None,
                                    "max_token_len_per_gpu": None, "forward_only": False},
                             doc="What every training engine reads: the strategy and how micro-batches are formed.")
FSDPEngineConfig = section_class("FSDPEngineConfig", "actor_rollout_ref.actor.fsdp_config", (EngineConfig,),
                                 module=__name__, doc="The FSDP2 engine's section (`fsdp_config`); hardware keys "
                                                      "left `auto` are decided by verl.compat's plan.")
McoreEngineConfig = unsupported_class("McoreEngineConfig", EngineConfig, "the Megatron engine", __name__)
TorchtitanEngineConfig = unsupported_class("TorchtitanEngineConfig", EngineConfig, "the TorchTitan engine", __name__)
VeOmniEngineConfig = unsupported_class("VeOmniEngineConfig", EngineConfig, "the VeOmni engine", __name__)
AutomodelEngineConfig = unsupported_class("AutomodelEngineConfig", EngineConfig, "the NeMo Automodel engine",
                                          __name__)
EngineRouterReplayConfig = unsupported_class("EngineRouterReplayConfig", EngineConfig, "MoE router replay", __name__)
QATEngineConfig = unsupported_class("QATEngineConfig", EngineConfig, "quantization-aware training", __name__)
TrainingWorkerConfig = unsupported_class("TrainingWorkerConfig", EngineConfig,
                                         "the engine-based TrainingWorker (this verl's workers are "
                                         "verl.workers.fsdp_workers)", __name__)
