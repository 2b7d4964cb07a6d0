"""Host memory an offloaded plan needs. FSDP2's CPU offload keeps an offloaded role's weights and gradients
in host RAM, and an offloaded optimizer keeps AdamW's moments there (its step runs there too): a plan that
fits the device can still not fit the host, and the kernel's OOM killer would end the run without a word.

On a GPU those weights and gradients are page-locked (so their copies to and from the device run
asynchronously), and torch's page-locked allocator reserves every request at the next power of two: a
tensor just over a power of two costs nearly twice its size. So the host state is summed tensor by tensor
(each rank's shard of it), rounded where it is page-locked. Moments the host optimizer creates itself are
ordinary memory, counted at their size.
"""
from __future__ import annotations

import math

from verl.compat.planning.decider import MemoryShortfall
from verl.compat.planning.memory import ADAMW8BIT_BYTES, BYTES, GiB
from verl.compat.planning.model_spec import ModelSpec
from verl.compat.plan import RolePlan

PROCESS_GB = 3.0        # one worker process's own host memory (Python, torch, CUDA's host side, Ray)
USABLE_SHARE = 0.9      # of the host's RAM; the rest is the OS, the driver process and page cache


def pinned_size(nbytes: float) -> int:
    """What torch's page-locked allocator reserves for a request of `nbytes`: the next power of two."""
    return 1 << (max(math.ceil(nbytes), 1) - 1).bit_length()


def weight_tensors(model: ModelSpec) -> tuple[list[int], int]:
    """Element counts of the model's large weight tensors (embedding, untied head, every linear layer of the
    decoder and of a VL model's vision tower), and the elements of the rest (norms, biases, small tensors)."""
    sizes = [model.vocab_size * model.hidden_size] + ([model.lm_head_params] if model.lm_head_params else [])
    sizes += [i * o for i, o in model.linear_shapes()] * model.num_layers
    tower = model.vision
    if tower is not None:
        h, wide = tower.hidden_size, tower.hidden_size * tower.patches_per_token
        mlp = [h * tower.intermediate_size] * (3 if tower.gated else 2)
        sizes += [tower.patch_features * h] + ([3 * h * h, h * h] + mlp) * tower.depth
        sizes += [wide * wide, wide * (tower.out_hidden_size or model.hidden_size)]
    return sizes, max(model.num_params - sum(sizes), 0)


def _copy_bytes(model: ModelSpec, element_bytes: float, shards: int, pinned: bool) -> float:
    """Host bytes of one rank's shard of every weight, held once in `element_bytes` per element."""
    if not pinned:
        return model.num_params * element_bytes / shards
    sizes, rest = weight_tensors(model)
    return sum(pinned_size(n * element_bytes / shards) for n in sizes) + rest * element_bytes / shards


def host_state_gb(model: ModelSpec, roles: dict[str, RolePlan], nnodes: int = 1, ranks_per_node: int = 1,
                  pinned: bool = True) -> float:
    """GiB of offloaded role state one node holds: each of its ranks keeps its shard of every tensor (FSDP2
    spreads each tensor over every rank). `pinned`: the offloaded weights and gradients are page-locked
    (a GPU run; on CPU nothing is)."""
    shards = max(nnodes, 1) * max(ranks_per_node, 1)
    per_rank = 0.0
    for name, role in roles.items():
        trainable = name != "ref" and not role.lora_rank
        if role.param_offload:
            stored = role.param_dtype if trainable else (role.frozen_dtype or role.param_dtype)
            copies = 2 if trainable else 1        # weights, and their gradients
            per_rank += copies * _copy_bytes(model, BYTES[stored], shards, pinned)
        if role.optimizer_offload and trainable:
            if role.optimizer_8bit:
                per_rank += model.num_params * ADAMW8BIT_BYTES / shards
            elif role.param_offload:      # the host optimizer makes its own two float32 moments: ordinary memory
                per_rank += model.num_params * 8 / shards
            else:                         # moments parked between steps in page-locked buffers, one per tensor
                per_rank += 2 * _copy_bytes(model, 4, shards, pinned)
    return per_rank * max(ranks_per_node, 1) / GiB


def check_host_memory(host_memory_gb: float, model: ModelSpec, roles: dict[str, RolePlan], ranks_per_node: int,
                      nnodes: int = 1, pinned: bool = True) -> None:
    """Raise MemoryShortfall when the offloaded state and the worker processes exceed the host's usable RAM.
    An unknown host size (0, a catalog profile in the doctor) is not checked."""
    state = host_state_gb(model, roles, nnodes, ranks_per_node, pinned)
    if host_memory_gb <= 0 or state == 0:
        return
    need = state + PROCESS_GB * ranks_per_node
    usable = USABLE_SHARE * host_memory_gb
    if need > usable:
        offloaded = ", ".join(n for n, r in roles.items() if r.param_offload or r.optimizer_offload)
        raise MemoryShortfall(
            f"The plan offloads {offloaded} to host memory, which needs about {need:.1f} GiB per node "
            f"({state:.1f} GiB of weights, gradients and optimizer states, page-locked ones at the power-of-two "
            f"sizes torch reserves for them, plus {PROCESS_GB:g} GiB per worker process), but this host has "
            f"{host_memory_gb:.1f} GiB ({usable:.1f} usable). Use a host with more memory, more nodes (the shards "
            f"spread over them), or a smaller model.")
