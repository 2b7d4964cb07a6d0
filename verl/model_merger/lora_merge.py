"""LoRA checkpoints in the merger: the adapters taken out of the shards, added into the base weights, and
written as a peft adapter folder.

A LoRA actor's shards name every tensor as peft does (`base_model.model.` + the model's name; the frozen
weight under an adapter at `<layer>.base_layer.weight`, the adapters at `<layer>.lora_A.default.weight`
and `lora_B`), beside `lora_train_meta.json` (rank, alpha, task type). The merged weight of a layer is
`W + (alpha / r) · B @ A`, computed in float32 (see `Adapters.merge_into` for the dtype written); `lora_adapter/` holds
`adapter_config.json` and `adapter_model.safetensors` under peft's saved names (the adapter name dropped),
so `peft.PeftModel.from_pretrained(base, "<target>/lora_adapter")` or
`actor_rollout_ref.model.lora_adapter_path` loads it. A QLoRA base is dequantized first (bitsandbytes).
"""
from __future__ import annotations

import json
import os
import warnings

import torch

from verl.utils.lora import ADAPTER, META_FILE, STATE_PREFIX

ADAPTER_FOLDER = "lora_adapter"
_A, _B = f".lora_A.{ADAPTER}.weight", f".lora_B.{ADAPTER}.weight"


def read_meta(local_dir: str) -> dict:
    path = os.path.join(local_dir, META_FILE)
    if not os.path.isfile(path):
        return {}
    with open(path) as f:
        return json.load(f)


class Adapters:
    """The adapters of one checkpoint: layer name -> (A, B), with rank, alpha and task type."""

    def __init__(self, layers: dict[str, tuple[torch.Tensor, torch.Tensor]], rank: int, alpha: float, task_type: str):
        self.layers, self.rank, self.alpha, self.task_type = layers, rank, alpha, task_type

    def merge_into(self, state: dict[str, torch.Tensor]) -> "Adapters":
        """Add each layer's `(alpha / r) · B @ A` into `state[<layer>.weight]` (in place); returns self.

        A base stored narrower than its adapters (float16 under float32 adapters) would round the
        updates away, so then every floating tensor of `state` is written in the adapters' dtype."""
        scale = self.alpha / self.rank
        widest = None
        for layer, (a, b) in self.layers.items():
            key = f"{layer}.weight"
            if key not in state:
                raise KeyError(f"the adapter of {layer} has no base weight {key} in the checkpoint")
            dtype = torch.promote_types(state[key].dtype, b.dtype)
            state[key] = (state[key].float() + scale * (b.float() @ a.float())).to(dtype)
            widest = dtype if widest is None else torch.promote_types(widest, dtype)
        for key, value in state.items():
            if value.is_floating_point() and value.dtype != widest:
                state[key] = value.to(widest)
        return self

    def save(self, folder: str) -> str:
        """`adapter_config.json` + `adapter_model.safetensors` as peft writes them; returns the folder."""
        import peft
        from safetensors.torch import save_file

        targets = sorted({layer.rsplit(".", 1)[-1] for layer in self.layers})
        config = peft.LoraConfig(r=self.rank, lora_alpha=self.alpha, target_modules=targets,
                                 task_type=self.task_type).to_dict()
        config = {k: (sorted(v) if isinstance(v, set) else getattr(v, "value", v)) for k, v in config.items()}
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, "adapter_config.json"), "w") as f:
            json.dump(config, f, indent=2)
        tensors = {}
        for layer, (a, b) in self.layers.items():
            tensors[f"{STATE_PREFIX}{layer}.lora_A.weight"] = a.contiguous()
            tensors[f"{STATE_PREFIX}{layer}.lora_B.weight"] = b.contiguous()
        save_file(tensors, os.path.join(folder, "adapter_model.safetensors"))
        return folder


def _base_name(key: str) -> str:
    return key.removeprefix(STATE_PREFIX).replace(".base_layer.", ".")


_QUANT_STATE = ".weight.quant_state.bitsandbytes__"


def dequantize_4bit(shard: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A QLoRA shard with every bitsandbytes 4-bit weight (packed bytes plus its `weight.<quant item>`
    entries) turned back into a dense matrix in the dtype it was quantized from. A 4-bit base runs on one
    device, so its checkpoint has one shard."""
    packed = {k.split(_QUANT_STATE)[0] for k in shard if _QUANT_STATE in k}
    if not packed:
        return shard
    import bitsandbytes.functional as bnb_functional

    out = {k: v for k, v in shard.items() if not any(k.startswith(f"{p}.weight.") for p in packed)}
    for layer in packed:
        items = {k[len(f"{layer}.weight."):]: v for k, v in shard.items() if k.startswith(f"{layer}.weight.")}
        state = bnb_functional.QuantState.from_dict(items, device=torch.device("cpu"))
        out[f"{layer}.weight"] = bnb_functional.dequantize_4bit(shard[f"{layer}.weight"], state)
    return out


def split_adapters(shards: list[dict[str, torch.Tensor]], local_dir: str) -> tuple[list[dict], Adapters]:
    """The shards under the base model's names without the adapters, and the adapters (whole tensors:
    FSDP2 splits every parameter along dim 0, so each is its ranks' parts joined in rank order)."""
    meta = read_meta(local_dir)
    shards = [dequantize_4bit(s) for s in shards]
    layers: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for key in shards[0]:
        if key.endswith(_A):
            layer = key.removeprefix(STATE_PREFIX)[: -len(_A)]
            b_key = key[: -len(_A)] + _B
            layers[layer] = (torch.cat([s[key] for s in shards], dim=0), torch.cat([s[b_key] for s in shards], dim=0))
    if not layers:
        raise KeyError(f"{local_dir}: LoRA tensors found but no `{_A}` adapters; was it saved by this verl?")
    inferred = next(iter(layers.values()))[0].shape[0]
    rank = int(meta.get("r", inferred))
    if rank != inferred:
        raise ValueError(f"{META_FILE} says rank {rank}, the adapters have rank {inferred}")
    if "lora_alpha" not in meta:
        warnings.warn(f"{local_dir} has no {META_FILE}: merging with lora_alpha = r ({rank}), i.e. scale 1",
                      stacklevel=2)
    alpha = meta.get("lora_alpha", rank)
    rest = [{_base_name(k): v for k, v in s.items() if ".lora_" not in k} for s in shards]
    return rest, Adapters(layers, rank, alpha, str(meta.get("task_type", "CAUSAL_LM")))


__all__ = ["ADAPTER_FOLDER", "Adapters", "dequantize_4bit", "read_meta", "split_adapters"]
