"""What the planner knows about a device and the installed software.

Plain dataclasses, filled either by detection on the real machine (`detect.py`) or from the
catalog (`catalog.py`) when simulating another GPU. Planning reads only these, never torch.cuda.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from verl.compat.device.engines import engine_names


@dataclass(frozen=True)
class DeviceProfile:
    """One accelerator (or the CPU) as the planner sees it."""

    name: str                      # catalog key ("p40", "h200", "cpu") or the detected GPU name
    backend: str                   # "cuda" | "rocm" | "cpu"
    compute_capability: tuple[int, int] | None  # (6, 1) on a P40; None on CPU
    memory_gb: float               # total device memory (host RAM for cpu), GiB
    free_memory_gb: float | None = None
    count: int = 1                 # devices of this kind on the node
    sm_count: int = 0
    shared_mem_per_block_kb: int = 0   # opt-in maximum per block
    bandwidth_gbps: float = 0.0    # memory bandwidth, GB/s
    fp32_tflops: float = 0.0
    fp16_tflops: float = 0.0       # tensor-core rate where the device has tensor cores
    bf16_tflops: float = 0.0       # 0 where the device has no native bf16
    native_bf16: bool = False      # compute capability >= 8.0 (or CDNA >= 3), never emulated
    tensor_core_fp16: bool = False  # compute capability >= 7.0
    tf32: bool = False             # compute capability >= 8.0
    host_memory_gb: float = 0.0
    host_cpu_count: int = 0        # CPU cores this process may use; 0 when unknown (catalog entries)
    simulated: bool = False        # True when this profile stands in for another device
    note: str = ""                 # why detection fell back (e.g. an MPS/XPU device planned as cpu)

    def to_dict(self) -> dict:
        return asdict(self)


def cc_name(profile: DeviceProfile) -> str:
    """The compute capability as CUDA names its architectures ("sm_61"); the backend's name without one."""
    if profile.backend == "cpu" or profile.compute_capability is None:
        return profile.backend
    return f"sm_{profile.compute_capability[0]}{profile.compute_capability[1]}"


@dataclass(frozen=True)
class SoftwareInfo:
    """Installed software and whether each piece can run on the profiled device.

    `*_usable` are verdicts for *this* device; `notes` says why something is unusable.
    """

    torch_version: str
    torch_arch_list: tuple[str, ...] = ()   # torch.cuda.get_arch_list(); empty on CPU builds
    transformers_version: str | None = None
    flash_attn_version: str | None = None
    flash_attn_usable: bool = False
    xformers_version: str | None = None
    xformers_usable: bool = False
    torch_varlen_usable: bool = False       # torch's own variable-length FlashAttention kernel (sm_80+)
    vllm_version: str | None = None
    vllm_usable: bool = False
    triton_usable: bool = False
    peft_version: str | None = None          # LoRA adapters (`model.lora_rank` > 0) are built with peft
    bitsandbytes_version: str | None = None  # 4-bit base (QLoRA) and 8-bit AdamW; support per device: support.py
    # The rollout engines this verl builds (verl.compat.device.engines); vLLM may be usable on the device
    # and still not be planned while its engine is not listed there.
    rollout_engines: tuple[str, ...] = field(default_factory=engine_names)
    notes: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)
