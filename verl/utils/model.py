"""Model helpers upstream code imports (`verl.utils.model`): Hugging Face configs and models with overrides,
sizes, masks, LoRA module matching. Megatron-only helpers raise NotImplementedError (this verl trains with FSDP2).
Transformers is imported inside the functions that need it, so importing this module stays cheap."""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from typing import Optional

import numpy as np
import torch
from torch import nn

from verl.utils.torch_functional import compute_position_id_with_mask

__all__ = ["LambdaLayer", "squeeze", "update_model_config", "get_huggingface_actor_config", "get_generation_config",
           "create_huggingface_actor", "create_huggingface_critic", "get_model_size", "print_model_size",
           "create_random_mask", "compute_position_id_with_mask", "check_exclude_modules", "check_target_modules",
           "pad_packed_inputs", "load_valuehead_model", "get_hf_auto_model_class", "get_lora_rank_from_adapter",
           "CausalLMOutputForPPO", "normalize_model_name", "normalize_pp_vpp_params", "get_parallel_model_from_config",
           "load_megatron_model_weights", "load_megatron_gptmodel_weights", "load_mcore_dist_weights",
           "get_parallel_gptmodel_from_config", "patch_valuehead_model", "convert_weight_keys", "get_hf_model_path",
           "extract_multi_modal_inputs"]


class LambdaLayer(nn.Module):
    """A module that applies a function (a critic's value head ends with one that drops the last dim)."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args, **kwargs):
        return self.fn(*args, **kwargs)


def squeeze(x: torch.Tensor) -> torch.Tensor:
    return torch.squeeze(x, dim=-1)


def update_model_config(module_config, override_config_kwargs: dict) -> None:
    """Set each override on the config; a dict value updates the nested config of that name."""
    for key, value in override_config_kwargs.items():
        if isinstance(value, dict):
            update_model_config(getattr(module_config, key), value)
        else:
            setattr(module_config, key, value)


def get_huggingface_actor_config(model_name: str, override_config_kwargs=None, trust_remote_code=False):
    """The model's AutoConfig with the overrides applied."""
    from transformers import AutoConfig

    override_config_kwargs = override_config_kwargs or {}
    if not isinstance(override_config_kwargs, dict):
        raise TypeError(f"override_config_kwargs must be a dict, got {type(override_config_kwargs)}")
    config = AutoConfig.from_pretrained(model_name, trust_remote_code=trust_remote_code)
    update_model_config(config, override_config_kwargs)
    return config


def get_generation_config(model: str, trust_remote_code: bool = False):
    """The model's generation_config.json, else one derived from its config, else None."""
    from transformers import GenerationConfig

    try:
        return GenerationConfig.from_pretrained(model)
    except OSError:
        try:
            return GenerationConfig.from_model_config(get_huggingface_actor_config(model,
                                                                                   trust_remote_code=trust_remote_code))
        except OSError:
            return None


def create_huggingface_actor(model_name: str, override_config_kwargs=None, automodel_kwargs=None) -> nn.Module:
    """A randomly initialised causal LM with the model's (overridden) config."""
    from transformers import AutoModelForCausalLM

    automodel_kwargs = dict(automodel_kwargs or {})
    config = get_huggingface_actor_config(model_name, override_config_kwargs,
                                          trust_remote_code=automodel_kwargs.get("trust_remote_code", False))
    return AutoModelForCausalLM.from_config(config, **automodel_kwargs)


def create_huggingface_critic(model_name: str, override_config_kwargs=None, automodel_kwargs=None) -> nn.Module:
    """`create_huggingface_actor` with its LM head replaced by a one-output value head."""
    module = create_huggingface_actor(model_name, override_config_kwargs, automodel_kwargs)
    dtype = (automodel_kwargs or {}).get("torch_dtype", torch.float32)
    module.lm_head = nn.Sequential(nn.Linear(module.config.hidden_size, 1, dtype=dtype), LambdaLayer(fn=squeeze))
    return module


_SCALES = {"B": 1e9, "M": 1e6, "K": 1e3, "": 1}


def get_model_size(model: nn.Module, scale: str = "auto") -> tuple[float, str]:
    """(parameter count in `scale` units, scale); "auto" picks B, M, K or none."""
    n = sum(p.numel() for p in model.parameters())
    if scale == "auto":
        scale = next(s for s in ("B", "M", "K", "") if n > _SCALES[s] or s == "")
    if scale not in _SCALES:
        raise NotImplementedError(f"Unknown scale {scale}")
    return (n / _SCALES[scale] if scale else n), scale


def print_model_size(model: nn.Module, name: Optional[str] = None) -> None:
    size, scale = get_model_size(model)
    print(f"{name or type(model).__name__} contains {size:.2f}{scale} parameters")


def create_random_mask(input_ids: torch.Tensor, max_ratio_of_valid_token: float, max_ratio_of_left_padding: float,
                       min_ratio_of_valid_token: float = 0) -> torch.Tensor:
    """A 0/1 mask per row: a random left padding, then a random number of valid tokens, then right padding."""
    if not 0 < max_ratio_of_valid_token <= 1.0 or not 0 <= max_ratio_of_left_padding < 1.0:
        raise ValueError("need 0 < max_ratio_of_valid_token <= 1 and 0 <= max_ratio_of_left_padding < 1")
    if min_ratio_of_valid_token > max_ratio_of_valid_token:
        raise ValueError("min_ratio_of_valid_token exceeds max_ratio_of_valid_token")
    batch, length = input_ids.shape
    most_valid = int(length * max_ratio_of_valid_token)
    least_valid = max(1, int(length * min_ratio_of_valid_token))
    most_left = int(length * max_ratio_of_left_padding)
    if most_valid + most_left > length or most_valid <= 0:
        raise ValueError("valid tokens plus left padding do not fit in the sequence")
    mask = torch.zeros_like(input_ids, dtype=torch.int64)
    for row in range(batch):
        left = np.random.randint(0, most_left + 1)
        valid = np.random.randint(least_valid, most_valid + 1)
        mask[row, left:left + valid] = 1
    return mask


def check_exclude_modules(config, key: str) -> bool:
    """Whether module name `key` is excluded by the adapter config's `exclude_modules` (a regex or names)."""
    excluded = getattr(config, "exclude_modules", None)
    if not excluded:
        return False
    if isinstance(excluded, str):
        return re.fullmatch(excluded, key) is not None
    return key in excluded or any(key.endswith(f".{name}") for name in excluded)


def check_target_modules(config, key: str) -> bool:
    """Whether module name `key` is a LoRA target of the adapter config (`target_modules` as a regex or names,
    narrowed by `layers_to_transform` / `layers_pattern` when given), as peft matches them."""
    targets = config.target_modules
    if isinstance(targets, str):
        return re.fullmatch(targets, key) is not None
    if key in targets:
        return True
    if not any(key.endswith(f".{name}") for name in targets):
        return False
    layers = getattr(config, "layers_to_transform", None)
    if layers is None or (isinstance(layers, list) and not layers):
        return True
    patterns = getattr(config, "layers_pattern", None)
    patterns = [patterns] if isinstance(patterns, str) else (patterns or [])
    found = None
    for pattern in patterns or [None]:
        found = re.match(r".*\.[^.]*\.(\d+)\." if pattern is None else rf".*\.{pattern}\.(\d+)\.", key)
        if found:
            break
    if found is None:
        return False
    index = int(found.group(1))
    return index == layers if isinstance(layers, int) else index in layers


def pad_packed_inputs(unpad_tokens: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen_in_batch: int, size: int):
    """Pad packed tokens to a multiple of `size` with one extra (padding) sequence at the end."""
    pad = -unpad_tokens.shape[0] % size
    if pad == 0:
        return unpad_tokens, cu_seqlens, max_seqlen_in_batch
    if unpad_tokens.ndim not in (1, 2):
        raise NotImplementedError(f"Padding dim {unpad_tokens.ndim} is not supported")
    widths = (0, pad) if unpad_tokens.ndim == 1 else (0, 0, 0, pad)
    unpad_tokens = nn.functional.pad(unpad_tokens, widths)
    cu_seqlens = nn.functional.pad(cu_seqlens, (0, 1), value=int(cu_seqlens[-1]) + pad)
    return unpad_tokens, cu_seqlens, max(max_seqlen_in_batch, pad)


def load_valuehead_model(local_path, torch_dtype, model_config, trust_remote_code):
    """A value model: the checkpoint as a one-label token classifier (how this verl's critic is built; the
    attention kernel is left to transformers' default here, the workers take theirs from the compat plan)."""
    from transformers import AutoModelForTokenClassification

    return AutoModelForTokenClassification.from_pretrained(local_path, torch_dtype=torch_dtype, config=model_config,
                                                           trust_remote_code=trust_remote_code)


_BY_SUFFIX = ("ForCausalLM", "ForVision2Seq", "ForTokenClassification", "ForSequenceClassification")


def get_hf_auto_model_class(hf_config):
    """The transformers Auto class for the config's first architecture (remote code's auto_map first)."""
    import transformers

    arch = (getattr(hf_config, "architectures", None) or [""])[0]
    auto_map = getattr(hf_config, "auto_map", None) or {}
    for auto_name, target in auto_map.items():
        if arch and arch in str(target):
            return getattr(transformers, auto_name, transformers.AutoModel)
    image_text = transformers.AutoModelForImageTextToText
    if type(hf_config) in image_text._model_mapping.keys():
        return image_text
    for suffix in _BY_SUFFIX:
        if suffix in arch:
            return getattr(transformers, "AutoModel" + suffix)
    return transformers.AutoModel


def get_lora_rank_from_adapter(adapter_path) -> int:
    """`r` from the adapter folder's adapter_config.json."""
    folder = os.path.abspath(os.path.expanduser(str(adapter_path)))
    if not os.path.exists(folder):
        raise FileNotFoundError(f"LoRA adapter path not found: {folder}")
    config_path = os.path.join(folder, "adapter_config.json")
    if not os.path.exists(config_path):
        raise FileNotFoundError(f"adapter_config.json not found in {folder}")
    try:
        with open(config_path, encoding="utf-8") as handle:
            config = json.load(handle)
    except json.JSONDecodeError as exc:
        raise ValueError(f"Invalid JSON in {config_path}: {exc}") from exc
    if "r" not in config:
        raise ValueError(f"LoRA rank 'r' not found in {config_path}")
    return int(config["r"])


def get_hf_model_path(config) -> str:
    """A local copy of `config.model.path` (hub ids and hdfs:// paths fetched once)."""
    from verl.utils.fs import copy_to_local

    return copy_to_local(config.model.path)


def convert_weight_keys(state_dict: dict, model) -> dict:
    """State-dict keys as the checkpoint on disk spells them. Transformers renames some modules on load
    (`_checkpoint_conversion_mapping`: checkpoint regex -> loaded name); each loaded name is searched for and
    replaced by the checkpoint pattern with its anchor and capture groups dropped (the first mapping that hits)."""
    mapping = getattr(model, "_checkpoint_conversion_mapping", None)
    if not mapping:
        return state_dict
    back = [(loaded, re.sub(r"\(.*\)", "", on_disk.lstrip("^"))) for on_disk, loaded in mapping.items()]
    converted = {}
    for key, value in state_dict.items():
        for loaded, on_disk in back:
            key, hits = re.subn(loaded, on_disk, key)
            if hits:
                break
        converted[key] = value
    return converted


def extract_multi_modal_inputs(*args, **kwargs):
    raise NotImplementedError("extract_multi_modal_inputs: multi-modal (vision/audio) inputs are not supported by "
                              "this verl")


def _megatron_only(name: str):
    def unsupported(*args, **kwargs):
        raise NotImplementedError(f"verl.utils.model.{name} is Megatron-only; this verl trains with FSDP2")

    unsupported.__name__ = name
    unsupported.__doc__ = f"Upstream's Megatron helper {name}: not supported here (raises NotImplementedError)."
    return unsupported


normalize_model_name = _megatron_only("normalize_model_name")
normalize_pp_vpp_params = _megatron_only("normalize_pp_vpp_params")
get_parallel_model_from_config = _megatron_only("get_parallel_model_from_config")
load_megatron_model_weights = _megatron_only("load_megatron_model_weights")
load_megatron_gptmodel_weights = _megatron_only("load_megatron_gptmodel_weights")
load_mcore_dist_weights = _megatron_only("load_mcore_dist_weights")
get_parallel_gptmodel_from_config = _megatron_only("get_parallel_gptmodel_from_config")
patch_valuehead_model = _megatron_only("patch_valuehead_model")


def _causal_lm_output_for_ppo():
    from transformers.modeling_outputs import CausalLMOutputWithPast

    @dataclass
    class CausalLMOutputForPPO(CausalLMOutputWithPast):
        """A causal LM's output with per-token log-probs and entropy computed in the forward."""

        log_probs: Optional[torch.FloatTensor] = None
        entropy: Optional[torch.FloatTensor] = None

    return CausalLMOutputForPPO


def __getattr__(name: str):
    if name == "CausalLMOutputForPPO":  # built on first use: it needs transformers
        cls = _causal_lm_output_for_ppo()
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
