"""LoRA on peft for the actor: wrapping, the reference pass without adapters, merged weights for inference.

The adapters are injected into the Hugging Face model in place (peft's `get_peft_model`), and the worker
keeps training, sharding and generating with that same model object: its forward, config and layers stay
where every other part of verl looks for them; each targeted linear layer computes `W x + s·B(A x)`.
Only the adapters (`lora_A`, `lora_B`) require gradients.

Names follow upstream verl 0.9.1's checkpoints: shards hold peft's names, which prefix the model's own with
`base_model.model.` (`STATE_PREFIX`); a LoRA layer keeps its frozen weight at `<layer>.base_layer.weight`
and the adapters at `<layer>.lora_A.default.weight` / `lora_B`. `lora_train_meta.json` beside the shards
records rank, alpha and task type for `verl.model_merger`.
"""
from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator

import torch
from torch import nn

STATE_PREFIX = "base_model.model."
ADAPTER = "default"   # peft's name for the one adapter a model gets without naming it
META_FILE = "lora_train_meta.json"


def _peft():
    try:
        import peft
    except ImportError as err:
        raise ImportError("actor_rollout_ref.model.lora_rank > 0 needs peft: pip install 'verl[peft]' "
                          "(or set lora_rank=0)") from err
    return peft


def _modules_setting(value):
    """`target_modules` / `exclude_modules` from the config: a list, a single name or regex, or None."""
    if value is None:
        return None
    if isinstance(value, str):
        return value
    return [str(v) for v in value]


def lora_config(model_cfg, rank: int):
    """peft's LoraConfig from upstream's keys: `lora_rank` (here the plan's), `lora_alpha`, `target_modules`
    (default all-linear: every linear layer but the output head), `exclude_modules`."""
    peft = _peft()
    if rank <= 0:
        raise ValueError(f"LoRA needs actor_rollout_ref.model.lora_rank > 0, got {rank}")
    get = model_cfg.get if hasattr(model_cfg, "get") else (lambda k, d=None: getattr(model_cfg, k, d))
    return peft.LoraConfig(
        r=int(rank),
        lora_alpha=int(get("lora_alpha", 16) or 16),
        target_modules=_modules_setting(get("target_modules", "all-linear") or "all-linear"),
        exclude_modules=_modules_setting(get("exclude_modules", None)),
        lora_dropout=0.0,   # the rollout, the old log-probs and the update must see one policy
        bias="none",
        task_type="CAUSAL_LM",
    )


def add_adapters(model: nn.Module, model_cfg, rank: int, trainable_dtype: torch.dtype, seed: int = 42) -> nn.Module:
    """Inject LoRA adapters into `model` (in place; returns it) and freeze everything else.

    The adapters are created (B = 0, so the model starts as the base; A drawn at random from `seed`, so
    every rank and every run starts alike) or, with `lora_adapter_path`, loaded from a peft adapter
    folder to continue training it. They are kept in `trainable_dtype` (the role's param dtype) whatever
    the frozen weights are stored in."""
    peft = _peft()
    get = model_cfg.get if hasattr(model_cfg, "get") else (lambda k, d=None: getattr(model_cfg, k, d))
    adapter_path = get("lora_adapter_path", None)
    if adapter_path:
        if not os.path.isfile(os.path.join(adapter_path, "adapter_config.json")):
            raise FileNotFoundError(f"actor_rollout_ref.model.lora_adapter_path={adapter_path!r} has no "
                                    "adapter_config.json; point it at a peft adapter folder (e.g. a merge's lora_adapter/)")
        wrapped = peft.PeftModel.from_pretrained(model, adapter_path, is_trainable=True)
    else:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            wrapped = peft.get_peft_model(model, lora_config(model_cfg, rank))
    inner = wrapped.get_base_model()
    inner._verl_lora_config = wrapped.peft_config[ADAPTER]
    for name, param in inner.named_parameters():
        param.requires_grad_(_is_adapter(name))
        if _is_adapter(name) and param.dtype != trainable_dtype:
            param.data = param.data.to(trainable_dtype)
    return inner


def _is_adapter(name: str) -> bool:
    return ".lora_" in name


def has_adapters(model: nn.Module) -> bool:
    return getattr(model, "_verl_lora_config", None) is not None


def _lora_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    from peft.tuners.lora import LoraLayer

    return [(name, m) for name, m in model.named_modules() if isinstance(m, LoraLayer)]


@contextlib.contextmanager
def adapters_disabled(model: nn.Module):
    """Every LoRA layer computes its frozen base alone inside the block: the reference policy."""
    layers = [m for _, m in _lora_layers(model)] if has_adapters(model) else []
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield model
    finally:
        for layer in layers:
            layer.enable_adapters(True)


def train_meta(model: nn.Module) -> dict:
    """Upstream's lora_train_meta.json content: rank, alpha and task type of the trained adapter."""
    cfg = model._verl_lora_config
    task = getattr(cfg.task_type, "value", cfg.task_type) or "CAUSAL_LM"
    return {"r": int(cfg.r), "lora_alpha": int(cfg.lora_alpha), "task_type": str(task)}


def write_train_meta(model: nn.Module, folder: str) -> None:
    with open(os.path.join(folder, META_FILE), "w") as f:
        json.dump(train_meta(model), f, indent=4)


def _full(tensor: torch.Tensor) -> torch.Tensor:
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def dense_weight(weight: torch.Tensor) -> torch.Tensor:
    """A weight as a plain floating-point matrix: a bitsandbytes 4-bit weight is dequantized."""
    quant_state = getattr(weight, "quant_state", None)
    if quant_state is not None:
        import bitsandbytes.functional as bnb_functional

        return bnb_functional.dequantize_4bit(weight.data, quant_state)
    return _full(weight).detach()


def _is_4bit(module: nn.Module) -> bool:
    return getattr(getattr(module, "weight", None), "quant_state", None) is not None


def inference_weights(model: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) pairs under the base model's own names, for an engine that loads plain weights (vLLM).

    A LoRA layer gives its merged weight `W + s·B@A` (computed in float32, W dequantized first when it is
    4-bit), in the wider of W's and the adapters' dtypes: a float16 base with float32 adapters (the p40
    plan) gives float32, since float16 would round away the small updates that training adds; a 4-bit layer outside the adapters gives its dequantized weight.
    A model without either gives exactly its state_dict. Parameters must be whole (unsharded) or DTensors."""
    lora = dict(_lora_layers(model)) if has_adapters(model) else {}
    quantized = {name: m for name, m in model.named_modules() if _is_4bit(m) and not any(
        name == p or name.startswith(p + ".") for p in lora)}
    if not lora and not quantized:
        for name, tensor in model.state_dict().items():
            yield name, _full(tensor).detach()
        return
    special = list(lora) + list(quantized)

    def inside(name: str) -> bool:
        return any(name == p or name.startswith(p + ".") for p in special)

    for prefix, module in lora.items():
        base = module.get_base_layer()
        weight = dense_weight(base.weight)
        delta = module.get_delta_weight(ADAPTER) if module.merged is False and not module.disable_adapters \
            else torch.zeros((), device=weight.device)
        dtype = torch.promote_types(_dense_dtype(base.weight, weight), module.lora_B[ADAPTER].weight.dtype)
        yield f"{prefix}.weight", (weight.float() + _full(delta).float()).to(dtype)
        if getattr(base, "bias", None) is not None:
            yield f"{prefix}.bias", _full(base.bias).detach()
    for prefix, module in quantized.items():
        yield f"{prefix}.weight", dense_weight(module.weight)
        if getattr(module, "bias", None) is not None:
            yield f"{prefix}.bias", _full(module.bias).detach()
    for name, tensor in model.state_dict().items():
        if not inside(name.rsplit(".", 1)[0]):
            yield name, _full(tensor).detach()


def _dense_dtype(stored: torch.Tensor, dense: torch.Tensor) -> torch.dtype:
    return dense.dtype if getattr(stored, "quant_state", None) is not None else stored.dtype


__all__ = ["ADAPTER", "META_FILE", "STATE_PREFIX", "adapters_disabled", "add_adapters", "dense_weight",
           "has_adapters", "inference_weights", "lora_config", "train_meta", "write_train_meta"]
