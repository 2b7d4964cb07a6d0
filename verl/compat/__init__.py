"""Every hardware decision of the fork, made once from the device, the software and the model.

    plan = verl.compat.build_plan(config)        # driver: detect (or simulate), read the model, plan
    print(verl.compat.format_plan(plan))         # the table main_ppo and the doctor print
    verl.compat.resolve_config(config, plan)     # concrete values over every `auto`
    device = verl.compat.apply_in_process(plan, local_rank)   # first thing in every worker

Importing this package loads torch only; omegaconf, the planner and transformers load when used.
"""
from __future__ import annotations

import logging

from verl.compat.apply.apply_plan import apply_in_process, dtype_name, resolve_config, torch_dtype
from verl.compat.device.detect import (
    SimulationNeedsGPUError,
    UnsupportedDeviceError,
    check_can_run,
    check_torch_supports,
    detect_profile,
    detect_software,
    simulate_name,
)
from verl.compat.plan import Plan, RolePlan, RolloutPlan
from verl.compat.device.profile import DeviceProfile, SoftwareInfo

__all__ = [
    "DeviceProfile",
    "Plan",
    "RolePlan",
    "RolloutPlan",
    "SimulationNeedsGPUError",
    "SoftwareInfo",
    "StrictModeError",
    "UnsupportedDeviceError",
    "apply_in_process",
    "build_plan",
    "check_can_run",
    "check_torch_supports",
    "detect_profile",
    "detect_software",
    "dtype_name",
    "format_device",
    "format_plan",
    "make_plan",
    "model_spec_for",
    "resolve_config",
    "torch_dtype",
]

logger = logging.getLogger(__name__)


class StrictModeError(ValueError):
    """`compat.strict=true` and a setting had to be adapted to the device."""


def make_plan(profile, config, software, model, *, reward_model=None) -> Plan:
    """The planner's pure decision function (see verl.compat.planning.planner)."""
    from verl.compat.planning.planner import make_plan as _make_plan

    return _make_plan(profile, config, software, model, reward_model=reward_model)


def _select(config, path: str, default=None):
    """`config.a.b` from a DictConfig or a plain dict (verl.compat.planning.settings, the one reader)."""
    from verl.compat.planning.settings import get

    return get(config, path, default)


def model_spec_for(config):
    """The ModelSpec of the actor's model (`hf_config_path` if set, else `path`), from config.json."""
    from verl.compat.planning.model_spec import ModelSpec

    return ModelSpec.from_pretrained(_select(config, "actor_rollout_ref.model.hf_config_path")
                                     or _select(config, "actor_rollout_ref.model.path"))


def reward_model_spec_for(config):
    """The reward model's ModelSpec when `reward_model.enable` is on (None otherwise, or when its path has no
    readable config.json: the worker then names the path when it loads it)."""
    from verl.compat.planning.model_spec import ModelSpec
    from verl.compat.planning.reward_model import reward_model_enabled, rm_setting

    path = rm_setting(config, "model_path") if reward_model_enabled(config) else None
    if not path:
        return None
    try:
        return ModelSpec.from_pretrained(path)
    except (FileNotFoundError, KeyError, TypeError, ValueError):
        return None


def build_plan(config, model=None, *, to_run: bool = True) -> Plan:
    """Driver side: profile the device (or the one `compat.device` / $VERL_COMPAT_DEVICE names),
    judge the software, read the model's config.json, and plan. Adapted settings are logged as
    warnings, or raise StrictModeError under `compat.strict=true`. `model` (a ModelSpec) replaces
    reading `actor_rollout_ref.model.path`. `to_run=False` plans without running (the doctor): a
    simulated GPU then needs no real one (else SimulationNeedsGPUError, before anything starts)."""
    profile = detect_profile(simulate_name(_select(config, "compat.device")))
    if to_run:
        check_can_run(profile)
    from verl.compat.planning.planner import xformers_asked

    software = detect_software(profile, probe_xformers=xformers_asked(config))
    check_torch_supports(profile, software)
    plan = make_plan(profile, config, software, model if model is not None else model_spec_for(config),
                     reward_model=reward_model_spec_for(config))
    if profile.note:
        plan.reasons.setdefault("device", profile.note)
    if plan.warnings and bool(_select(config, "compat.strict", False)):
        raise StrictModeError("compat.strict=true and the device cannot honour these settings:\n"
                              + "\n".join(f"- {w}" for w in plan.warnings))
    for warning in plan.warnings:
        logger.warning("verl.compat: %s", warning)
    return plan


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _device_line(profile: DeviceProfile) -> str:
    where = " (simulated)" if profile.simulated else ""
    if profile.backend == "cpu":
        return f"{profile.name}{where}: cpu, {profile.memory_gb:.1f} GiB RAM"
    cc = profile.compute_capability
    return (f"{profile.name}{where} x{profile.count}: {profile.backend} sm_{cc[0]}{cc[1]}, {profile.memory_gb:.1f} GiB, "
            f"{profile.sm_count} SMs, {profile.shared_mem_per_block_kb} KB shared memory/block, "
            f"bf16 {_yes(profile.native_bf16)}, fp16 tensor cores {_yes(profile.tensor_core_fp16)}, "
            f"tf32 {_yes(profile.tf32)}; host RAM {profile.host_memory_gb:.1f} GiB")


def format_device(profile: DeviceProfile, software: SoftwareInfo) -> list[str]:
    """The device line and the software verdicts: what holds whatever the config says."""
    lines = [f"  device    {_device_line(profile)}"]
    for key, note in software.notes.items():
        lines.append(f"  {'software' if key == 'torch' else '':9s} {key}: {note}")
    return lines


_ROW_NAMES = {"reward_model": "rm"}   # the plan table's role column is 8 wide


def _trained_what(plan: Plan) -> list[str]:
    """One line per role that trains adapters, keeps 8-bit AdamW states or stores frozen weights apart."""
    out = []
    for name in ("actor", "critic", "ref"):
        r = getattr(plan, name)
        if r is None:
            continue
        parts = []
        if r.lora_rank:
            base = "4-bit NF4" if r.base_quantization else r.frozen_dtype
            parts.append(f"LoRA r={r.lora_rank} on a frozen {base} base")
        elif name == "ref" and r.frozen_dtype and r.frozen_dtype != r.param_dtype:
            parts.append(f"stored in {r.frozen_dtype}, computed in {r.compute_dtype}")
        if r.optimizer_8bit:
            parts.append("AdamW8bit states")
        if name == "actor" and plan.ref_in_actor:
            parts.append("reference = the actor with its adapters disabled")
        if parts:
            out.append(f"  {name:8s} " + "; ".join(parts))
    return out


def format_plan(plan: Plan) -> str:
    """The human-readable plan: device, software verdicts, one row per role, then the reasons."""
    lines = ["verl.compat plan", *format_device(plan.device, plan.software)]
    head = (f"  {'role':8s} {'params':9s} {'compute':9s} {'scaler':6s} {'attention':17s} "
            f"{'rm_pad':6s} {'ckpt':4s} {'fsdp':4s} {'offload p/o':11s} {'micro':5s} {'peak GiB':>8s}")
    lines += ["", head]
    for name in ("actor", "critic", "ref", "reward_model"):
        r = getattr(plan, name)
        if r is None:
            continue
        micro = (str(r.micro_batch_size_per_gpu) if r.micro_batch_size_per_gpu is not None
                 else f"{r.max_token_len_per_gpu}t")
        lines.append(
            f"  {_ROW_NAMES.get(name, name):8s} {r.param_dtype:9s} {r.compute_dtype:9s} {_yes(r.grad_scaler):6s} "
            f"{r.attn_implementation:17s} {_yes(r.use_remove_padding):6s} {_yes(r.gradient_checkpointing):4s} "
            f"{_yes(r.fsdp):4s} {_yes(r.param_offload) + '/' + _yes(r.optimizer_offload):11s} {micro:5s} {r.predicted_peak_gb:8.2f}")
    lines += _trained_what(plan)
    rollout = plan.rollout
    if plan.generates:
        lines.append(f"  {'rollout':8s} {rollout.name} ({rollout.dtype}, {rollout.attn_implementation}, "
                     f"gpu_memory_utilization {rollout.gpu_memory_utilization:.2f}, "
                     f"enforce_eager {_yes(rollout.enforce_eager)}) {rollout.predicted_peak_gb:8.2f}")
    lines.append(f"  global   device {plan.device_type}, backend {plan.dist_backend}, "
                 f"torch.compile {_yes(plan.torch_compile)}"
                 f"{f' ({plan.compile_warmup})' if plan.torch_compile else ''}, tf32 {_yes(plan.tf32)}; predicted peak "
                 f"{plan.predicted_peak_gb:.2f} GiB of {plan.memory_limit_gb:.2f} GiB")
    if plan.reasons:
        lines += ["", "  why:"]
        lines += [f"    {key}: {why}" for key, why in sorted(plan.reasons.items())]
    if plan.warnings:
        lines += ["", "  adapted settings:"]
        lines += [f"    - {w}" for w in plan.warnings]
    return "\n".join(lines)
