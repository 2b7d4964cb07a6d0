"""The compat plan: every hardware decision for one run, each with a one-line reason.

Produced by `verl.compat.planning.planner.make_plan(profile, config, software, model)` (a pure function) and
handed to the trainer and every worker. Workers read these fields; they never inspect the GPU.
Dtypes are written as torch attribute names ("float32", "float16", "bfloat16"); turn them into
torch dtypes with `verl.compat.torch_dtype(name)`.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from verl.compat.device.profile import DeviceProfile, SoftwareInfo


@dataclass
class RolePlan:
    """Decisions for one model role (actor, critic or ref)."""

    param_dtype: str            # dtype the FSDP-sharded master weights are kept in
    compute_dtype: str          # autocast / mixed-precision compute dtype
    grad_scaler: bool           # True for float16 compute (dynamic loss scaling)
    attn_implementation: str    # "eager" | "sdpa" | "xformers" | "torch_varlen" | "flash_attention_2"
    use_remove_padding: bool    # pack sequences (only with a kernel that handles packed input)
    gradient_checkpointing: bool
    param_offload: bool
    optimizer_offload: bool
    micro_batch_size_per_gpu: int | None = None   # None when use_dynamic_bsz
    max_token_len_per_gpu: int | None = None      # token budget when use_dynamic_bsz
    predicted_peak_gb: float = 0.0
    forward_micro_batch_size_per_gpu: int | None = None  # no-grad forwards (log-probs, values)
    forward_max_token_len_per_gpu: int | None = None     # their token budget when use_dynamic_bsz
    # How the compute dtype is applied: True casts the parameters when FSDP all-gathers them (FSDP2's
    # MixedPrecisionPolicy); False gathers them in param_dtype and autocast alone computes in compute_dtype.
    cast_on_gather: bool = False
    reduce_dtype: str = "float32"          # dtype FSDP reduce-scatters gradients in
    numerics_guard: bool = False           # compare half precision with float32 on the first real batch
    guard_fallback_dtype: str | None = None  # compute dtype the role switches to when the guard fails
    use_dynamic_bsz: bool = False   # token-budgeted micro-batches (verl/compat/planning/throughput.py)
    fused_optimizer: bool = False   # AdamW's fused kernel (trainable roles on an accelerator)
    # FSDP2's reshard_after_forward: False keeps each layer's gathered weights from its forward to its
    # backward in an update (no second all-gather, a whole model gathered at the end of forward)
    reshard_after_forward: bool = True
    # forward-only passes (log-probs, reference log-probs, values) gather the whole model once per call
    # instead of every layer per micro-batch (fsdp_utils.full_params)
    gather_for_forward: bool = False
    # False: the model runs unwrapped. On one device FSDP2 shards nothing and its gather only copies the
    # weights; compat wraps there only where FSDP2 also casts them or keeps them in host memory
    fsdp: bool = True
    # LoRA (`<role>.model.lora_rank` > 0): peft adapters train, the base weights are frozen
    lora_rank: int = 0
    # storage dtype of weights that never train (a LoRA base, the reference model); None: param_dtype.
    # A half-precision store on a float32-compute device is upcast layer by layer for compute
    frozen_dtype: str | None = None
    base_quantization: str | None = None   # "nf4": the frozen base is stored 4-bit by bitsandbytes (QLoRA)
    optimizer_8bit: bool = False           # AdamW moments kept in 8 bits (bitsandbytes)
    # Ulysses (`<role>.ulysses_sequence_parallel_size`): ranks splitting each micro-batch's sequence, so
    # each holds 1/sp of its activations; the data-parallel size is the ranks / sp
    sequence_parallel_size: int = 1
    # a vision-language actor's `actor.freeze_vision_tower`: the tower does not train and keeps nothing for backward
    vision_frozen: bool = False


@dataclass
class RolloutPlan:
    name: str                    # "vllm" | "hf" (built-in engine)
    dtype: str
    gpu_memory_utilization: float
    enforce_eager: bool
    attn_implementation: str
    predicted_peak_gb: float = 0.0
    micro_batch_size: int | None = None   # most sequences the built-in engine generates at once; None: vLLM schedules
    cuda_graphs: bool = False             # the built-in engine replays its decode step as a CUDA graph
    compile_backend: str | None = None    # torch.compile backend for the built-in engine's decode step; None: eager
    fused_projections: bool = False       # the built-in engine decodes with q/k/v and gate/up each as one matmul
    free_cache_engine: bool = False       # vLLM sleeps (frees KV cache, offloads weights) while the actor trains


@dataclass
class Plan:
    device: DeviceProfile
    software: SoftwareInfo
    device_type: str             # torch device type workers place tensors on: "cuda" | "cpu"
    dist_backend: str            # torch.distributed backend string: "gloo" (CPU) | "cpu:gloo,cuda:nccl"
    torch_compile: bool
    tf32: bool
    actor: RolePlan
    critic: RolePlan | None
    ref: RolePlan | None
    rollout: RolloutPlan
    predicted_peak_gb: float     # the largest per-device peak across phases
    memory_limit_gb: float       # what the plan had to fit in (simulated cap or real total)
    reasons: dict[str, str] = field(default_factory=dict)   # "actor.compute_dtype" -> why
    warnings: list[str] = field(default_factory=list)       # user settings that were adapted
    memory: dict = field(default_factory=dict)   # memory model breakdown: phase -> term -> GiB
    dataloader_num_workers: int = 0   # driver-side loader processes (data.dataloader_num_workers)
    # the reference policy is the LoRA actor with its adapters disabled (no second model; `ref` is None)
    ref_in_actor: bool = False
    reward_model: RolePlan | None = None   # the sequence-classification reward model (verl/compat/planning/reward_model.py)
    # when torch_compile's code is built (verl/compat/planning/compile.py): "background" (the first step eager,
    # the compiled code built beside the next eager ones), "synchronous" (before the first step) or "off"
    compile_warmup: str = "synchronous"
    compile_cache_dir: str | None = None   # inductor's cache folder (None: torch's default)
    generates: bool = True   # False: the run samples nothing (SFT); `rollout` is then unused and not printed

    @property
    def use_remove_padding(self) -> bool:
        return self.actor.use_remove_padding

    def to_dict(self) -> dict:
        """JSON-ready form (the doctor's `--json` output is built on this)."""
        out = asdict(self)
        out["use_remove_padding"] = self.use_remove_padding
        return out
