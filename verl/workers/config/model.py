"""The model section (`actor_rollout_ref.model`) typed."""
from __future__ import annotations

from verl.base_config import BaseConfig
from verl.utils.config_sections import section_class, unsupported_class

__all__ = ["HFModelConfig", "MtpConfig"]

HFModelConfig = section_class(
    "HFModelConfig", "actor_rollout_ref.model", module=__name__,
    extra={"local_path": None, "local_hf_config_path": None, "local_tokenizer_path": None,
           "model_type": "language_model", "load_tokenizer": True},
    doc="`actor_rollout_ref.model`: a Hugging Face model's path, tokenizer, overrides, LoRA and padding removal. "
        "Load the model and tokenizer with verl.utils.model / verl.utils.hf_tokenizer.")
MtpConfig = unsupported_class("MtpConfig", BaseConfig, "multi-token prediction (MTP)", __name__)
