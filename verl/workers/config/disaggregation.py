"""Prefill-decode disaggregation config name (not supported here)."""
from verl.base_config import BaseConfig
from verl.utils.config_sections import unsupported_class

__all__ = ["DisaggregationConfig"]

DisaggregationConfig = unsupported_class("DisaggregationConfig", BaseConfig, "prefill-decode disaggregation",
                                         __name__)
