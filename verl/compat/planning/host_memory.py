"""Host memory an offloaded plan needs. FSDP2's CPU offload keeps an offloaded role's weights and gradients
in host RAM, and an offloaded optimizer keeps AdamW's moments there (its step runs there too): a plan that
fits the device can still not fit the host, and the kernel's OOM killer would end the run without a word."""
from __future__ import annotations

from verl.compat.planning.decider import MemoryShortfall
from verl.compat.planning.memory import ADAMW8BIT_BYTES, BYTES, GiB
from verl.compat.planning.model_spec import ModelSpec
from verl.compat.plan import RolePlan

PROCESS_GB = 3.0        # one worker process's own host memory (Python, torch, CUDA's host side, Ray)
USABLE_SHARE = 0.9      # of the host's RAM; the rest is the OS, the driver process and page cache


def host_state_gb(model: ModelSpec, roles: dict[str, RolePlan], nnodes: int = 1) -> float:
    """GiB of offloaded role state one node holds (FSDP2 spreads the shards over every node's ranks)."""
    total = 0.0
    for name, role in roles.items():
        trainable = name != "ref" and not role.lora_rank
        if role.param_offload:
            per_param = BYTES[role.param_dtype] * (2 if trainable else 1)        # weights, and their gradients
            total += model.num_params * per_param
        if role.optimizer_offload and trainable:
            total += model.num_params * (ADAMW8BIT_BYTES if role.optimizer_8bit else 8)
    return total / GiB / max(nnodes, 1)


def check_host_memory(host_memory_gb: float, model: ModelSpec, roles: dict[str, RolePlan], ranks_per_node: int,
                      nnodes: int = 1) -> None:
    """Raise MemoryShortfall when the offloaded state and the worker processes exceed the host's usable RAM.
    An unknown host size (0, a catalog profile in the doctor) is not checked."""
    state = host_state_gb(model, roles, nnodes)
    if host_memory_gb <= 0 or state == 0:
        return
    need = state + PROCESS_GB * ranks_per_node
    usable = USABLE_SHARE * host_memory_gb
    if need > usable:
        offloaded = ", ".join(n for n, r in roles.items() if r.param_offload or r.optimizer_offload)
        raise MemoryShortfall(
            f"The plan offloads {offloaded} to host memory, which needs about {need:.1f} GiB per node "
            f"({state:.1f} GiB of weights, gradients and optimizer states plus {PROCESS_GB:g} GiB per worker "
            f"process), but this host has {host_memory_gb:.1f} GiB ({usable:.1f} usable). Use a host with more "
            f"memory, more nodes (the shards spread over them), or a smaller model.")
