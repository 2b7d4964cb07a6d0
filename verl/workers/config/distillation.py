"""Distillation config names (on-policy distillation from a teacher model is not supported here)."""
from verl.base_config import BaseConfig
from verl.utils.config_sections import unsupported_class

__all__ = ["DistillationLossConfig", "DistillationTeacherModelConfig", "DistillationConfig"]

DistillationLossConfig = unsupported_class("DistillationLossConfig", BaseConfig, "distillation", __name__)
DistillationTeacherModelConfig = unsupported_class("DistillationTeacherModelConfig", BaseConfig, "distillation",
                                                   __name__)
DistillationConfig = unsupported_class("DistillationConfig", BaseConfig, "distillation", __name__)
