"""Carry a plan out: in each worker process (`apply_in_process`) and in the config (`resolve_config`).

`apply_in_process` is the first thing every worker calls. On a simulated device it also *enforces*
the simulated limits on the real GPU — a memory cap, no TF32 where the device has none, no SDPA
flash kernel below sm_80 — so code paths meant for a P40 or T4 meet the same walls on an H200.
`resolve_config` writes the plan's concrete values over the config's `auto`s, so the rest of the
code reads ordinary upstream keys and never sees `auto`.
"""
from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

import torch

from verl.compat.planning import settings
from verl.compat.plan import Plan, RolePlan
from verl.compat.planning.throughput import UPSTREAM_TOKEN_BUDGET

if TYPE_CHECKING:      # omegaconf loads only when a config is resolved: `import verl.compat` stays light
    from omegaconf import DictConfig

logger = logging.getLogger(__name__)

GiB = 1024**3

# torch's cuBLAS workspace, one per (thread's handle, stream) that ran a matmul, held for the process's
# life and counted by the caching allocator: 32 MiB from sm_90 on, 8.125 MiB (":4096:2:16:8") below.
CUBLAS_WORKSPACE_ENV = "CUBLAS_WORKSPACE_CONFIG"
PRE_HOPPER_CUBLAS_WORKSPACE = ":4096:2:16:8"


def torch_dtype(name: str | torch.dtype) -> torch.dtype:
    """"float16" / "fp16" / "bf16" / "float32" ... -> the torch dtype (a torch dtype passes through)."""
    if isinstance(name, torch.dtype):
        return name
    return getattr(torch, settings.dtype_name(name))


def dtype_name(name: str | torch.dtype) -> str:
    """Canonical torch name of a dtype spelling: "bf16" -> "bfloat16"."""
    return str(torch_dtype(name)).removeprefix("torch.")


# ----------------------------------------------------------------------------- in-process

def _set_tf32(enabled: bool) -> None:
    """TF32 for fp32 matmuls and convolutions, through the newer precision flags where torch has
    them (mixing them with the legacy `allow_tf32` flags makes torch raise on later reads)."""
    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):
        precision = "tf32" if enabled else "ieee"
        matmul.fp32_precision = precision
        torch.backends.cudnn.conv.fp32_precision = precision
        torch.backends.cudnn.rnn.fp32_precision = precision
    else:
        matmul.allow_tf32 = enabled
        torch.backends.cudnn.allow_tf32 = enabled


def _enforce_simulated_limits(plan: Plan, local_rank: int) -> None:
    """Make the real GPU behave like the simulated one where it matters for planning."""
    profile = plan.device
    real_total = torch.cuda.get_device_properties(local_rank).total_memory
    cap = profile.memory_gb * GiB
    if cap < real_total:
        torch.cuda.set_per_process_memory_fraction(cap / real_total, local_rank)
    if not profile.tf32:
        _set_tf32(False)
    workspace = _simulate_cublas_workspace(profile, local_rank)
    if profile.compute_capability is not None and profile.compute_capability < (8, 0):
        # The SDPA flash (and cuDNN) kernels need sm_80; below it PyTorch would pick them on the
        # real H200 and the simulated run would not exercise the kernels a T4/P40 really gets.
        torch.backends.cuda.enable_flash_sdp(False)
        if hasattr(torch.backends.cuda, "enable_cudnn_sdp"):
            torch.backends.cuda.enable_cudnn_sdp(False)
    logger.info("simulating %s on %s: memory capped at %.1f GiB of %.1f, tf32=%s, cuBLAS workspace %s",
                profile.name, torch.cuda.get_device_name(local_rank), profile.memory_gb,
                real_total / GiB, profile.tf32 and plan.tf32, workspace)


def _simulate_cublas_workspace(profile, local_rank: int) -> str:
    """Give cuBLAS the simulated device's workspace size, not the real one's.

    A pre-Hopper GPU gets 8.125 MiB per (handle, stream), an H200 32 MiB; a run touches four or five
    such pairs (the autograd thread has its own handle; the rollout adds streams), so a Hopper's
    workspaces would hold about 0.1 GiB more than the simulated device does. Takes effect only before this
    process's first matmul (torch reads the variable once); a value the user set is kept.
    """
    if os.environ.get(CUBLAS_WORKSPACE_ENV):
        return f"{os.environ[CUBLAS_WORKSPACE_ENV]} (set by the user)"
    props = torch.cuda.get_device_properties(local_rank)
    simulated_pre_hopper = profile.compute_capability is not None and profile.compute_capability < (9, 0)
    if simulated_pre_hopper and (props.major, props.minor) >= (9, 0):
        os.environ[CUBLAS_WORKSPACE_ENV] = PRE_HOPPER_CUBLAS_WORKSPACE
        return f"{PRE_HOPPER_CUBLAS_WORKSPACE} (torch's default below sm_90)"
    return "torch's default"


def _roles(plan: Plan) -> list[RolePlan]:
    return [r for r in (plan.actor, plan.critic, plan.ref) if r is not None]


_APPLIED: Plan | None = None   # the plan apply_in_process put in force in this process


def applied_plan() -> Plan | None:
    """The plan this process runs under (None before apply_in_process): what verl.utils.device reports."""
    return _APPLIED


def apply_in_process(plan: Plan, local_rank: int = 0) -> torch.device:
    """Select this process's device and put the plan's process-wide settings in force."""
    global _APPLIED
    _APPLIED = plan
    if plan.device_type == "cpu":
        device = torch.device("cpu")
    else:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        _set_tf32(plan.tf32)
        if plan.device.simulated:
            _enforce_simulated_limits(plan, local_rank)
    if plan.torch_compile:
        use_compile_cache(plan.compile_cache_dir)
    attn = {r.attn_implementation for r in _roles(plan)} | {plan.rollout.attn_implementation}
    if "xformers" in attn:
        from verl.compat.apply.attention import register_xformers_attention

        register_xformers_attention()
    if "torch_varlen" in attn:
        from verl.compat.apply.varlen_attention import register_varlen_attention

        register_varlen_attention()
    return device


INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"


def use_compile_cache(folder: str | None) -> str | None:
    """Point inductor's on-disk caches (the FX graph and AOTAutograd caches, and triton's kernels beneath
    them) at the plan's folder, before this process compiles anything; a folder the user set in the
    environment is kept. The folder in use, or None where torch's default stays."""
    if os.environ.get(INDUCTOR_CACHE_ENV):
        return os.environ[INDUCTOR_CACHE_ENV]
    if folder is None:
        return None
    folder = os.path.expanduser(folder)
    os.makedirs(folder, exist_ok=True)
    os.environ[INDUCTOR_CACHE_ENV] = folder          # read by inductor whenever it looks for its folder
    os.environ.setdefault("TORCHINDUCTOR_FX_GRAPH_CACHE", "1")
    os.environ.setdefault("TORCHINDUCTOR_AUTOGRAD_CACHE", "1")
    return folder


_GPU_ONLY_ATTENTION = ("flash_attention_2", "xformers", "torch_varlen")


def on_host_cpu(plan: Plan) -> Plan:
    """A plan made for another device, to be run on this host's CPU (the plan-to-worker contract
    test, dry runs of a GPU plan without the GPU).

    Every numerics decision stays as planned: param, compute and reduce dtypes, casting on gather,
    grad scaler, numerics guard, rollout dtype, micro-batches, checkpointing and optimizer offload
    (torch's CPU autocast runs float16 and bfloat16; the optimizer state moves host to host).
    What a CPU cannot run is replaced, and each replacement is a reason in the returned plan:
    the device type and collective backend, GPU-only attention kernels (by sdpa, packed rows
    then use sdpa's block-diagonal mask), torch.compile (its CPU backend compiles for minutes) and
    param offload (FSDP2's CPU offload policy needs an accelerator to load the shards onto).
    Memory figures stay the device's: nothing here measures them.
    """
    import dataclasses

    reasons = dict(plan.reasons)
    stand_in = "run on the host CPU in place of " + plan.device.name

    def role(name: str, role_plan: RolePlan | None) -> RolePlan | None:
        if role_plan is None:
            return role_plan
        if role_plan.attn_implementation in _GPU_ONLY_ATTENTION:
            reasons[f"{name}.attn_implementation"] = f"sdpa for {role_plan.attn_implementation}: {stand_in}"
            role_plan = dataclasses.replace(role_plan, attn_implementation="sdpa")
        if role_plan.param_offload:
            reasons[f"{name}.param_offload"] = f"False (the shards already live in host memory): {stand_in}"
            role_plan = dataclasses.replace(role_plan, param_offload=False)
        return role_plan

    roles = {name: role(name, getattr(plan, name)) for name in ("actor", "critic", "ref", "reward_model")}
    rollout = plan.rollout
    if rollout.attn_implementation in _GPU_ONLY_ATTENTION:
        rollout = dataclasses.replace(rollout, attn_implementation="sdpa")
    for key, value in (("device_type", "cpu"), ("dist_backend", "gloo"), ("torch_compile", False),
                       ("tf32", False)):
        if getattr(plan, key) != value:
            reasons[key] = f"{value}: {stand_in}"
    return dataclasses.replace(plan, device_type="cpu", dist_backend="gloo", torch_compile=False, tf32=False,
                               rollout=rollout, reasons=reasons, **roles)


def device_memory_share(plan: Plan, share: float, local_rank: int = 0) -> float:
    """A share of the (possibly simulated) device's memory as a share of the real GPU's memory.

    Engines such as vLLM size their cache as a fraction of the *real* GPU; on a simulated P40 on an
    H200 the planned 0.3 of 24 GiB must become 0.3 * 24 / 141 of the H200.
    """
    if plan.device_type == "cpu" or not plan.device.simulated:
        return share
    real_total = torch.cuda.get_device_properties(local_rank).total_memory / GiB
    return share * min(plan.device.memory_gb, real_total) / real_total


# ----------------------------------------------------------------------------- config

# Where each role's settings live in upstream 0.9.1's key tree: (role block, FSDP engine block,
# model block or None when the role shares another role's model block).
_ROLE_KEYS = {
    "actor": ("actor_rollout_ref.actor", "actor_rollout_ref.actor.fsdp_config", "actor_rollout_ref.model"),
    "ref": ("actor_rollout_ref.ref", "actor_rollout_ref.ref.fsdp_config", None),
    "critic": ("critic", "critic.fsdp", "critic.model"),
}
# Micro-batch keys per role: (block, per-GPU micro-batch, its deprecated global form, token budget,
# "train" for the update pass or "forward" for no-grad log-prob / value passes).
_BATCH_KEYS = {
    "actor": [("actor_rollout_ref.actor", "ppo_micro_batch_size_per_gpu", "ppo_micro_batch_size",
               "ppo_max_token_len_per_gpu", "train", "actor"),
              ("actor_rollout_ref.rollout", "log_prob_micro_batch_size_per_gpu",
               "log_prob_micro_batch_size", "log_prob_max_token_len_per_gpu", "forward", "actor_forward")],
    "ref": [("actor_rollout_ref.ref", "log_prob_micro_batch_size_per_gpu", "log_prob_micro_batch_size",
             "log_prob_max_token_len_per_gpu", "forward", "ref")],
    "critic": [("critic", "ppo_micro_batch_size_per_gpu", "ppo_micro_batch_size",
                "ppo_max_token_len_per_gpu", "train", "critic"),
               ("critic", "forward_micro_batch_size_per_gpu", "forward_micro_batch_size",
                "forward_max_token_len_per_gpu", "forward", "critic_forward")],
}
# Leaf names that are hardware decisions; one of these still `auto` after resolving is a bug.
_HARDWARE_LEAVES = {"attn_implementation", "use_remove_padding", "use_torch_compile", "param_offload",
                    "optimizer_offload", "model_dtype", "dtype", "param_dtype", "reduce_dtype",
                    "buffer_dtype", "name", "gpu_memory_utilization", "enforce_eager", "device", "micro_batch_size",
                    "enable_gradient_checkpointing", "dataloader_num_workers", "use_dynamic_bsz",
                    "reshard_after_forward"}


def _exists(config: DictConfig, path: str) -> bool:
    from omegaconf import OmegaConf

    return OmegaConf.select(config, path, default=None, throw_on_missing=False) is not None


def _is_auto(config: DictConfig, path: str) -> bool:
    from omegaconf import OmegaConf

    return OmegaConf.select(config, path, default=None, throw_on_missing=False) == "auto"


def _set_by_user(config: DictConfig, path: str) -> bool:
    """A concrete value (not null, `auto` or an interpolation of another key) sits at `path`."""
    from omegaconf import OmegaConf

    parent, _, leaf = path.rpartition(".")
    node = OmegaConf.select(config, parent, default=None, throw_on_missing=False) if parent else config
    if not OmegaConf.is_dict(node) or leaf not in node or OmegaConf.is_missing(node, leaf) \
            or OmegaConf.is_interpolation(node, leaf):
        return False
    return node[leaf] is not None and node[leaf] != "auto"


def _set(config: DictConfig, path: str, value, written: dict, over_interpolation: bool = False) -> None:
    """Write `value` over an existing key. Keys the config lacks are not added (upstream's key tree
    stays as it is); interpolations are left to follow their source unless `over_interpolation`."""
    from omegaconf import OmegaConf

    parent, _, leaf = path.rpartition(".")
    node = OmegaConf.select(config, parent, default=None, throw_on_missing=False) if parent else config
    if not OmegaConf.is_dict(node) or leaf not in node:
        return
    if OmegaConf.is_interpolation(node, leaf) and not over_interpolation:
        return
    if not OmegaConf.is_missing(node, leaf) and node[leaf] == value:
        return
    node[leaf] = value
    written[path] = value


def _raw_autos(node, path: str = ""):
    """Paths of leaves literally set to `auto` in a plain container (interpolations stay strings)."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _raw_autos(value, f"{path}.{key}" if path else str(key))
    elif node == "auto":
        yield path


def _resolve_role(config: DictConfig, name: str, role: RolePlan, plan: Plan, written: dict) -> None:
    block, engine, model = _ROLE_KEYS[name]
    if not _exists(config, block):
        return
    for key, value in {
        "model_dtype": role.param_dtype,
        "dtype": role.compute_dtype,
        "mixed_precision.param_dtype": role.compute_dtype,
        "mixed_precision.reduce_dtype": role.reduce_dtype,
        "mixed_precision.buffer_dtype": "float32",
        "param_offload": role.param_offload,
        "optimizer_offload": role.optimizer_offload,
        "reshard_after_forward": role.reshard_after_forward,
        "use_torch_compile": plan.torch_compile,
    }.items():
        _set(config, f"{engine}.{key}", value, written)
    _set(config, f"{block}.use_torch_compile", plan.torch_compile, written)
    _set(config, f"{block}.use_remove_padding", role.use_remove_padding, written)
    if model is not None:
        _set(config, f"{model}.attn_implementation", role.attn_implementation, written)
        _set(config, f"{model}.use_remove_padding", role.use_remove_padding, written)
        _set(config, f"{model}.enable_gradient_checkpointing", role.gradient_checkpointing, written)
    if name == "actor":   # critic, ref and log-prob passes follow the actor's key (upstream's interpolations)
        _set(config, f"{block}.use_dynamic_bsz", role.use_dynamic_bsz, written)
    for section, per_gpu, global_key, tokens, which, budget_name in _BATCH_KEYS[name]:
        micro, budget = role.micro_batch_size_per_gpu, role.max_token_len_per_gpu
        if which == "forward":
            micro = role.forward_micro_batch_size_per_gpu or micro
            budget = role.forward_max_token_len_per_gpu or budget
        if _set_by_user(config, f"{section}.{global_key}"):
            pass   # upstream's deprecated global form, the user's choice: each worker divides it by its dp size
        elif micro is not None:
            _set(config, f"{section}.{per_gpu}", micro, written, over_interpolation=True)
        elif _is_auto(config, f"{section}.{per_gpu}"):
            _set(config, f"{section}.{per_gpu}", None, written)   # token budgets batch this pass
        if budget is None and _is_auto(config, f"{section}.{tokens}"):
            budget = UPSTREAM_TOKEN_BUDGET[budget_name]   # a plan without budgets: upstream's number, no `auto` left
        if budget is not None:
            _set(config, f"{section}.{tokens}", budget, written, over_interpolation=True)


def resolve_config(config: DictConfig, plan: Plan) -> dict:
    """Write the plan's concrete values into `config` (in place); returns {key path: value written}.

    Every hardware key gets the planned value: the planner already honoured explicit settings the
    device can run and adapted (with a warning) those it cannot, so the plan is the single truth.
    Forward passes (log-probs, values) get the plan's forward micro-batch or token budget. Upstream's
    deprecated global micro-batch keys, where the user set them, stay: workers divide them by dp.
    """
    from omegaconf import OmegaConf, open_dict

    written: dict = {}
    with open_dict(config):
        for name in ("actor", "ref", "critic"):
            # A role this run does not build still gets concrete values (the actor's), so no
            # `auto` is left for later code to trip over.
            _resolve_role(config, name, getattr(plan, name) or plan.actor, plan, written)
        rollout = plan.rollout
        for prefix in ("actor_rollout_ref.rollout", "reward.reward_model.rollout"):
            _set(config, f"{prefix}.name", rollout.name, written)
            rm = plan.reward_model if prefix.startswith("reward") else None   # the reward model's own dtype
            _set(config, f"{prefix}.dtype", rm.compute_dtype if rm else rollout.dtype, written)
            _set(config, f"{prefix}.gpu_memory_utilization", rollout.gpu_memory_utilization, written)
        _set(config, "actor_rollout_ref.rollout.enforce_eager", rollout.enforce_eager, written)
        _set(config, "actor_rollout_ref.rollout.micro_batch_size", rollout.micro_batch_size, written)
        _set(config, "trainer.device", plan.device_type, written)
        _set(config, "data.dataloader_num_workers", plan.dataloader_num_workers, written)
        _set(config, "compat.compile_warmup", plan.compile_warmup, written)
        _set(config, "compat.compile_cache_dir", plan.compile_cache_dir, written)
    raw = OmegaConf.to_container(config, resolve=False)
    left = [p for p in _raw_autos(raw) if p.rpartition(".")[2] in _HARDWARE_LEAVES]
    if left:
        raise ValueError(f"verl.compat has no rule for these `auto` settings: {', '.join(left)}. "
                         f"Set them explicitly.")
    return written
