"""make_plan: every hardware decision of a run, from (device, config, software, model) alone.

Pure: reads no environment, touches no device. Each decision comes with a one-line reason in
`plan.reasons`; a user setting the device cannot honour is replaced and named in
`plan.warnings` (or raises `PlanError` when `compat.strict` is true). Memory is fitted with the
memory model by walking a ladder: nothing offloaded -> optimizer offload -> params + optimizer
offload -> halve the micro-batches down to 1 -> `PlanError` with the shortfall.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from verl.compat.memory import (
    BYTES,
    GiB,
    Workload,
    estimate_memory,
    generation_bytes_per_sequence,
)
from verl.compat.model_spec import ModelSpec
from verl.compat.plan import Plan, RolePlan, RolloutPlan
from verl.compat.profile import DeviceProfile, SoftwareInfo

AUTO = object()
_DTYPE_NAMES = {"float32": "float32", "fp32": "float32", "float": "float32", "f32": "float32",
                "float16": "float16", "fp16": "float16", "half": "float16", "f16": "float16",
                "bfloat16": "bfloat16", "bf16": "bfloat16"}
_ATTN = ("eager", "sdpa", "xformers", "flash_attention_2")
MAX_ROLLOUT_MICRO_BATCH = 1024   # past this, bigger built-in generate passes gain little and hold the device longer


class PlanError(RuntimeError):
    """The run cannot be planned on this device (strict-mode refusal or memory shortfall)."""


# ----------------------------------------------------------------------------- config access

def _get(config: Any, path: str, default: Any = AUTO) -> Any:
    """Nested lookup in a dict or OmegaConf config; missing, None and "auto" read as `default`."""
    node = config
    for key in path.split("."):
        if node is None:
            return default
        try:
            node = node.get(key)
        except (AttributeError, TypeError):
            node = getattr(node, key, None)
    if node is None or (isinstance(node, str) and node.strip().lower() == "auto"):
        return default
    return node


def _first(config: Any, *paths: str) -> Any:
    for path in paths:
        value = _get(config, path)
        if value is not AUTO:
            return value
    return AUTO


def _dtype(value: Any) -> Any:
    if value is AUTO:
        return AUTO
    key = str(value).strip().lower().removeprefix("torch.")
    if key not in _DTYPE_NAMES:
        raise PlanError(f"Unknown dtype '{value}'; use float32, float16 or bfloat16 (or auto).")
    return _DTYPE_NAMES[key]


def _flag(value: Any) -> Any:
    if value is AUTO or isinstance(value, bool):
        return value
    return str(value).strip().lower() in ("1", "true", "yes", "on")


# ----------------------------------------------------------------------------- the decisions

class _Decider:
    """Collects reasons and warnings while deciding; `adapt` handles settings the device lacks."""

    def __init__(self, profile: DeviceProfile, software: SoftwareInfo, strict: bool):
        self.profile, self.software, self.strict = profile, software, strict
        self.reasons: dict[str, str] = {}
        self.warnings: list[str] = []

    def note(self, key: str, value: Any, reason: str) -> Any:
        self.reasons[key] = reason
        return value

    def adapt(self, key: str, setting: str, asked: Any, replacement: Any, why: str) -> Any:
        msg = f"{setting}={asked} is not possible on {self.profile.name}: {why}; using {replacement} instead."
        if self.strict:
            raise PlanError(msg + " (compat.strict=true: change the setting or set compat.strict=false)")
        self.warnings.append(msg)
        self.reasons[key] = f"adapted from {asked}: {why}"
        return replacement

    # -- capabilities
    @property
    def cc(self) -> tuple[int, int]:
        return self.profile.compute_capability or (0, 0)

    def dtype_missing(self, dtype: str) -> str | None:
        """Why the device cannot compute in `dtype` (None when it can)."""
        p = self.profile
        if dtype == "float32":
            return None
        if p.backend == "cpu":
            return "the CPU backend trains in float32 only (half-precision matmuls are emulated there)"
        if dtype == "bfloat16" and not p.native_bf16:
            return f"bfloat16 needs compute capability >= 8.0 (this device has {_cc(p)})"
        if dtype == "float16" and not p.tensor_core_fp16:
            return (f"float16 needs tensor cores (compute capability >= 7.0; this device has {_cc(p)}, "
                    f"where half precision runs at a fraction of float32 speed)")
        return None

    def default_dtype(self) -> tuple[str, str]:
        p = self.profile
        if p.backend == "cpu":
            return "float32", "CPU: float32 (no fast half-precision matmul)"
        if p.native_bf16:
            return "bfloat16", f"{_cc(p)} has native bfloat16: bfloat16 compute, float32 master weights"
        if p.tensor_core_fp16:
            return "float16", f"{_cc(p)} has float16 tensor cores but no bfloat16: float16 with a grad scaler"
        return "float32", f"{_cc(p)} has neither bfloat16 nor fast float16: float32"

    def attn_missing(self, attn: str, compute: str) -> str | None:
        sw = self.software
        if attn == "flash_attention_2":
            if self.profile.backend == "cuda" and self.cc < (8, 0):
                return f"FlashAttention-2 needs compute capability >= 8.0 ({_cc(self.profile)})"
            if not sw.flash_attn_usable:
                return sw.notes.get("flash_attn", "flash_attn is not installed or not usable on this device "
                                                  "(needs compute capability >= 8.0)")
            if compute == "float32":
                return "flash_attention_2 runs only in float16/bfloat16"
        if attn == "xformers" and not sw.xformers_usable:
            return sw.notes.get("xformers", "xformers is not installed or its kernels do not load on this device")
        if attn not in _ATTN:
            return f"unknown attention implementation (use one of {', '.join(_ATTN)})"
        return None


def _cc(p: DeviceProfile) -> str:
    if p.backend == "cpu" or p.compute_capability is None:
        return p.backend
    return f"sm_{p.compute_capability[0]}{p.compute_capability[1]}"


@dataclass
class _RoleConfig:
    """What the user asked for one role (AUTO where left to the planner)."""

    name: str
    prefix: str
    model_prefix: str
    fsdp_prefix: str
    trainable: bool


def _role_configs(config: Any) -> dict[str, _RoleConfig]:
    arr = "actor_rollout_ref"
    return {
        "actor": _RoleConfig("actor", f"{arr}.actor", f"{arr}.model", f"{arr}.actor.fsdp_config", True),
        "critic": _RoleConfig("critic", "critic", "critic.model", "critic.fsdp", True),
        "ref": _RoleConfig("ref", f"{arr}.ref", f"{arr}.model", f"{arr}.ref.fsdp_config", False),
    }


def _decide_role(d: _Decider, config: Any, rc: _RoleConfig, compute_default: str) -> RolePlan:
    n = rc.name
    fsdp = (rc.fsdp_prefix, "critic.model.fsdp_config") if n == "critic" else (rc.fsdp_prefix,)

    asked = _dtype(_first(config, *[f"{f}.dtype" for f in fsdp], *[f"{f}.mixed_precision.param_dtype" for f in fsdp]))
    if asked is AUTO:
        compute = d.note(f"{n}.compute_dtype", compute_default, d.reasons["compute_dtype"])
    elif (why := d.dtype_missing(asked)) is not None:
        compute = d.adapt(f"{n}.compute_dtype", f"{rc.fsdp_prefix}.dtype", asked, compute_default, why)
    else:
        compute = d.note(f"{n}.compute_dtype", asked, "set by the user; the device supports it")

    master = _dtype(_first(config, *[f"{f}.model_dtype" for f in fsdp]))
    if master is AUTO:
        if rc.trainable:
            param = d.note(f"{n}.param_dtype", "float32", "trained weights and AdamW states stay float32")
        else:
            param = d.note(f"{n}.param_dtype", compute, "a frozen model is kept in its compute dtype")
    elif (why := d.dtype_missing(master)) is not None:
        param = d.adapt(f"{n}.param_dtype", f"{rc.fsdp_prefix}.model_dtype", master, "float32", why)
    else:
        param = d.note(f"{n}.param_dtype", master, "set by the user")

    scaler = d.note(f"{n}.grad_scaler", compute == "float16" and rc.trainable,
                    "float16 compute needs dynamic loss scaling" if compute == "float16"
                    else f"not needed for {compute} compute")

    attn_asked = _first(config, f"{rc.model_prefix}.attn_implementation",
                        f"{rc.model_prefix}.override_config.attn_implementation")
    default_attn = "flash_attention_2" if d.attn_missing("flash_attention_2", compute) is None else "sdpa"
    attn_reason = ("flash_attn is installed and usable on this device" if default_attn == "flash_attention_2"
                   else "PyTorch SDPA (memory-efficient kernel, fp32 from sm_50; flash kernel from sm_80)"
                        + (f"; flash_attention_2 unavailable: {d.attn_missing('flash_attention_2', compute)}"
                           if d.profile.backend != "cpu" else ""))
    if attn_asked is AUTO:
        attn = d.note(f"{n}.attn_implementation", default_attn, attn_reason)
    elif (why := d.attn_missing(str(attn_asked), compute)) is not None:
        attn = d.adapt(f"{n}.attn_implementation", f"{rc.model_prefix}.attn_implementation",
                       attn_asked, default_attn, why)
    else:
        attn = d.note(f"{n}.attn_implementation", str(attn_asked), "set by the user; usable here")

    rmpad_asked = _flag(_first(config, f"{rc.model_prefix}.use_remove_padding"))
    packs = attn == "flash_attention_2"
    if rmpad_asked is AUTO:
        rmpad = d.note(f"{n}.use_remove_padding", packs,
                       "flash_attention_2 handles packed sequences" if packs
                       else f"{attn} needs padded batches (no packed-sequence kernel)")
    elif rmpad_asked and not packs:
        rmpad = d.adapt(f"{n}.use_remove_padding", f"{rc.model_prefix}.use_remove_padding", True, False,
                        f"packed sequences need flash_attention_2, and attention here is {attn}")
    else:
        rmpad = d.note(f"{n}.use_remove_padding", bool(rmpad_asked), "set by the user")

    return RolePlan(param_dtype=param, compute_dtype=compute, grad_scaler=scaler, attn_implementation=attn,
                    use_remove_padding=rmpad, gradient_checkpointing=False, param_offload=False,
                    optimizer_offload=False)


def _decide_rollout(d: _Decider, config: Any, compute: str, actor_attn: str) -> tuple[RolloutPlan, dict]:
    """The engine and its dtype; also returns the user's memory settings for the fit to weigh."""
    r = "actor_rollout_ref.rollout"
    asked = _get(config, f"{r}.name")
    engine_built = "vllm" in d.software.rollout_engines
    usable = engine_built and d.software.vllm_usable and d.profile.backend != "cpu" and \
        (d.profile.backend != "cuda" or d.cc >= (7, 0))
    why_not = d.software.notes.get("vllm", "vllm is not installed or does not support this device/dtype")
    if d.software.vllm_usable and not engine_built:
        why_not = f"{why_not}, but this verl has no vLLM rollout engine yet"
    elif d.software.vllm_usable and not usable:
        why_not = f"vLLM does not support {_cc(d.profile)} (it needs compute capability >= 7.0)"
    if asked is AUTO:
        name = d.note("rollout.name", "vllm" if usable else "hf",
                      "vllm is installed and supports this device" if usable
                      else f"built-in engine: {why_not}")
    elif str(asked) == "vllm" and not usable:
        name = d.adapt("rollout.name", f"{r}.name", asked, "hf", why_not)
    elif str(asked) not in ("vllm", "hf"):
        name = d.adapt("rollout.name", f"{r}.name", asked, "vllm" if usable else "hf",
                       "this fork ships the vllm and built-in (hf) engines only")
    else:
        name = d.note("rollout.name", str(asked), "set by the user; usable here")

    dt = _dtype(_get(config, f"{r}.dtype"))
    if dt is AUTO:
        dtype = d.note("rollout.dtype", compute, "follows the actor's compute dtype")
    elif (why := d.dtype_missing(dt)) is not None:
        dtype = d.adapt("rollout.dtype", f"{r}.dtype", dt, compute, why)
    else:
        dtype = d.note("rollout.dtype", dt, "set by the user")

    eager_asked = _flag(_get(config, f"{r}.enforce_eager"))
    if name == "hf":
        eager = d.note("rollout.enforce_eager", True, "the built-in engine runs eagerly (no CUDA graphs)")
    elif eager_asked is AUTO:
        eager = d.note("rollout.enforce_eager", d.cc < (7, 0), "CUDA graphs captured by vLLM" if d.cc >= (7, 0)
                       else "no CUDA graphs below sm_70")
    else:
        eager = d.note("rollout.enforce_eager", bool(eager_asked), "set by the user")
    attn = actor_attn if name == "hf" else "vllm"
    micro = _get(config, f"{r}.micro_batch_size")
    if micro is not AUTO and (isinstance(micro, bool) or not str(micro).isdigit() or int(micro) < 1):
        raise PlanError(f"{r}.micro_batch_size={micro} is not a positive whole number of sequences; "
                        "set it to 1 or more, or leave it unset (auto).")
    micro = micro if micro is AUTO else int(micro)
    if name == "vllm":
        d.note("rollout.micro_batch_size", None, "vLLM schedules its own batches"
               + (f" ({r}.micro_batch_size is read by the built-in engine only)" if micro is not AUTO else ""))
    asked = {"gpu_memory_utilization": _get(config, f"{r}.gpu_memory_utilization"), "micro_batch_size": micro}
    return RolloutPlan(name=name, dtype=dtype, gpu_memory_utilization=0.0, enforce_eager=eager,
                       attn_implementation=attn), asked


def _decide_globals(d: _Decider, config: Any) -> dict:
    p = d.profile
    out = {
        "device_type": d.note("device_type", "cpu" if p.backend == "cpu" else "cuda",
                              "no accelerator: CPU" if p.backend == "cpu"
                              else ("ROCm devices are torch's 'cuda' device type" if p.backend == "rocm"
                                    else "CUDA device")),
        "dist_backend": d.note("dist_backend", "gloo" if p.backend == "cpu" else "cpu:gloo,cuda:nccl",
                               "gloo: the CPU collective backend, within a node and across nodes"
                               if p.backend == "cpu"
                               else ((
                                   "nccl (RCCL on ROCm)" if p.backend == "rocm" else "nccl") + " for device tensors, "
                                   "gloo for the host-side tensors some collectives carry (loss token counts, "
                                   "checkpoint barriers): plain nccl rejects CPU tensors once there are 2+ ranks")),
        "tf32": d.note("tf32", bool(p.tf32), "TF32 matmuls on sm_80+" if p.tf32 else "the device has no TF32"),
    }
    asked = _flag(_first(config, "actor_rollout_ref.actor.use_torch_compile",
                         "actor_rollout_ref.actor.fsdp_config.use_torch_compile"))
    blocker = None
    if p.backend == "cpu":
        blocker = "torch.compile is not used on CPU"
    elif p.backend == "cuda" and d.cc < (7, 0):
        blocker = f"Triton (torch.compile's GPU backend) needs compute capability >= 7.0 ({_cc(p)})"
    elif not d.software.triton_usable:
        blocker = d.software.notes.get("triton", "triton is not installed or not usable on this device")
    if blocker is None:
        why = "triton usable here: actor and ref compile their entropy over the vocabulary"
        out["torch_compile"] = d.note("torch_compile", True if asked is AUTO else bool(asked),
                                      why if asked is AUTO else "set by the user")
    elif asked is True:
        out["torch_compile"] = d.adapt("torch_compile", "actor_rollout_ref.actor.use_torch_compile", True,
                                       False, blocker)
    else:
        out["torch_compile"] = d.note("torch_compile", False, blocker if asked is AUTO else "set by the user")
    return out


# ----------------------------------------------------------------------------- memory fitting

@dataclass
class _Batch:
    """Micro-batch knobs of the four forward/backward consumers (None: token budget instead)."""

    actor: int | None
    actor_forward: int | None
    critic: int | None
    critic_forward: int | None
    ref: int | None
    explicit: dict


def _micro_batches(config: Any, workload: Workload, n: int) -> _Batch:
    arr = "actor_rollout_ref"
    mini = int(_get(config, f"{arr}.actor.ppo_mini_batch_size", 256)) * n
    per_gpu = max(mini // workload.world_size, 1)
    auto_train = min(per_gpu, 8)

    def pick(*paths, default):
        v = _first(config, *paths)
        return (int(v), True) if v is not AUTO else (default, False)

    actor, ea = pick(f"{arr}.actor.ppo_micro_batch_size_per_gpu", default=auto_train)
    actor_fwd, eaf = pick(f"{arr}.rollout.log_prob_micro_batch_size_per_gpu", default=2 * actor)
    critic, ec = pick("critic.ppo_micro_batch_size_per_gpu", default=actor)
    critic_fwd, ecf = pick("critic.forward_micro_batch_size_per_gpu", default=critic)
    ref, er = pick(f"{arr}.ref.log_prob_micro_batch_size_per_gpu", default=actor_fwd)
    return _Batch(actor, actor_fwd, critic, critic_fwd, ref,
                  {"actor": ea, "actor_forward": eaf, "critic": ec, "critic_forward": ecf, "ref": er})


def _apply_batches(roles: dict[str, RolePlan], b: _Batch, dynamic: bool, budgets: dict) -> dict[str, RolePlan]:
    out = dict(roles)
    if dynamic:
        out["actor"] = replace(out["actor"], micro_batch_size_per_gpu=None, max_token_len_per_gpu=budgets["actor"],
                               forward_max_token_len_per_gpu=budgets["actor_forward"])
        if "critic" in out:
            out["critic"] = replace(out["critic"], micro_batch_size_per_gpu=None,
                                    max_token_len_per_gpu=budgets["critic"],
                                    forward_max_token_len_per_gpu=budgets["critic_forward"])
        if "ref" in out:
            out["ref"] = replace(out["ref"], micro_batch_size_per_gpu=None, max_token_len_per_gpu=budgets["ref"],
                                 forward_max_token_len_per_gpu=budgets["ref"])
        return out
    out["actor"] = replace(out["actor"], micro_batch_size_per_gpu=b.actor, forward_micro_batch_size_per_gpu=b.actor_forward)
    if "critic" in out:
        out["critic"] = replace(out["critic"], micro_batch_size_per_gpu=b.critic,
                                forward_micro_batch_size_per_gpu=b.critic_forward)
    if "ref" in out:
        out["ref"] = replace(out["ref"], micro_batch_size_per_gpu=b.ref, forward_micro_batch_size_per_gpu=b.ref)
    return out


def _vllm_need_gb(model: ModelSpec, workload: Workload, dtype: str) -> float:
    """The least vLLM needs: its weights, KV for min(batch, 16) full sequences, 0.5 GiB of scratch."""
    seqs = min(workload.rollout_batch_per_gpu, 16)
    kv = 2 * model.num_layers * model.num_kv_heads * model.head_dim * seqs * workload.seq_len * BYTES[dtype]
    return (model.num_params * BYTES[dtype] + kv) / GiB + 0.5


def make_plan(profile: DeviceProfile, config: Any, software: SoftwareInfo, model: ModelSpec | None = None) -> Plan:
    """Decide dtypes, attention, rollout engine, compile, backend and the memory plan for one run."""
    strict = bool(_flag(_get(config, "compat.strict", False)))
    margin = float(_get(config, "compat.memory_margin", 0.1))
    d = _Decider(profile, software, strict)
    compute_default, why = d.default_dtype()
    d.reasons["compute_dtype"] = why
    glob = _decide_globals(d, config)

    arr = "actor_rollout_ref"
    roles_cfg = _role_configs(config)
    adv = str(_get(config, "algorithm.adv_estimator", "gae"))
    critic_on = _flag(_get(config, "critic.enable"))
    critic_on = adv == "gae" if critic_on is AUTO else critic_on
    ref_on = bool(_flag(_get(config, "algorithm.use_kl_in_reward", False))) or \
        bool(_flag(_get(config, f"{arr}.actor.use_kl_loss", False)))
    d.reasons["roles"] = (f"critic {'on' if critic_on else 'off'} (adv_estimator={adv}); reference model "
                          f"{'on' if ref_on else 'off'} (use_kl_in_reward / use_kl_loss)")
    roles = {"actor": _decide_role(d, config, roles_cfg["actor"], compute_default)}
    if critic_on:
        roles["critic"] = _decide_role(d, config, roles_cfg["critic"], compute_default)
    if ref_on:
        roles["ref"] = _decide_role(d, config, roles_cfg["ref"], compute_default)
    d.reasons.pop("compute_dtype")
    rollout, rollout_asked = _decide_rollout(d, config, roles["actor"].compute_dtype,
                                             roles["actor"].attn_implementation)

    world = int(_get(config, "trainer.n_gpus_per_node", 1)) * int(_get(config, "trainer.nnodes", 1))
    world = 1 if profile.backend == "cpu" else max(world, 1)
    n = int(_get(config, f"{arr}.rollout.n", 1))
    workload = Workload(prompt_length=int(_get(config, "data.max_prompt_length", 512)),
                        response_length=int(_get(config, "data.max_response_length", 512)),
                        rollout_batch_per_gpu=math.ceil(int(_get(config, "data.train_batch_size", 1024)) * n / world),
                        world_size=world)
    dynamic = bool(_flag(_get(config, f"{arr}.actor.use_dynamic_bsz", False)))
    budgets = {"actor": int(_get(config, f"{arr}.actor.ppo_max_token_len_per_gpu", 16384)),
               "actor_forward": int(_get(config, f"{arr}.rollout.log_prob_max_token_len_per_gpu", 16384)),
               "critic": int(_get(config, "critic.ppo_max_token_len_per_gpu", 32768)),
               "critic_forward": int(_get(config, "critic.forward_max_token_len_per_gpu", 32768)),
               "ref": int(_get(config, f"{arr}.ref.log_prob_max_token_len_per_gpu", 16384))}
    batches = _micro_batches(config, workload, n)

    # user's memory-related choices (AUTO where the ladder may decide)
    asked_ckpt = {name: _flag(_first(config, f"{rc.model_prefix}.enable_gradient_checkpointing"))
                  for name, rc in roles_cfg.items()}
    asked_off = {name: (_flag(_first(config, f"{rc.fsdp_prefix}.param_offload")),
                        _flag(_first(config, f"{rc.fsdp_prefix}.optimizer_offload")))
                 for name, rc in roles_cfg.items()}

    plan_kwargs = dict(device=profile, software=software, actor=None, critic=None, ref=None, rollout=rollout,
                       predicted_peak_gb=0.0, memory_limit_gb=profile.memory_gb, **glob)
    if model is None:
        roles = _apply_batches(roles, batches, dynamic, budgets)
        for name in roles:
            ck = asked_ckpt[name]
            po, oo = asked_off[name]
            roles[name] = replace(roles[name], gradient_checkpointing=ck is not False,
                                  param_offload=po is True, optimizer_offload=oo is True)
        util_asked, micro_asked = rollout_asked["gpu_memory_utilization"], rollout_asked["micro_batch_size"]
        rollout.gpu_memory_utilization = float(util_asked) if util_asked is not AUTO else 0.5
        if rollout.name == "hf":
            rollout.micro_batch_size = None if micro_asked is AUTO else micro_asked
            d.note("rollout.micro_batch_size", rollout.micro_batch_size,
                   "no model config.json given: whole batches" if micro_asked is AUTO else "set by the user")
        d.reasons["memory"] = "no model config.json given: memory not planned, user settings kept"
        plan_kwargs.update(actor=roles["actor"], critic=roles.get("critic"), ref=roles.get("ref"))
        return Plan(reasons=d.reasons, warnings=d.warnings, **plan_kwargs)

    return _fit(d, model, workload, roles, rollout, rollout_asked, batches, dynamic, budgets, asked_ckpt,
                asked_off, margin, plan_kwargs)


def _ladder(asked_off: dict, roles: dict):
    """Offload rungs in order; a role whose user set offload explicitly keeps that setting."""
    def offload(level: int) -> dict[str, tuple[bool, bool]]:
        out = {}
        for name in roles:
            po, oo = asked_off[name]
            trainable = name != "ref"
            want_o = level >= 1 and trainable
            want_p = level >= 2
            out[name] = (po if po is not AUTO else want_p, (oo if oo is not AUTO else want_o) and trainable)
        return out
    return [("nothing offloaded", offload(0)), ("optimizer offload", offload(1)),
            ("params + optimizer offload", offload(2))]


def _chunk_size(fits: int, batch: int, asked: Any, whole: bool) -> int | None:
    """Sequences per built-in generate pass, given how many fit at once (None: too few fit).

    The user's size when it fits; else the largest power of two that fits (at most
    MAX_ROLLOUT_MICRO_BATCH), raised to the training batch when that fits whole so a training
    rollout runs in one pass. `whole` asks for the training batch (or the user's size) to fit
    in one pass, which the fit tries before settling for chunked training rollouts.
    """
    fits = min(fits, MAX_ROLLOUT_MICRO_BATCH)
    target = min(batch, MAX_ROLLOUT_MICRO_BATCH) if asked is AUTO else min(batch, asked)
    if fits < (target if whole else 1):
        return None
    if asked is not AUTO and asked <= fits:
        return asked
    return max(1 << (fits.bit_length() - 1), min(batch, fits))


def _fit(d: _Decider, model, workload, roles, rollout, rollout_asked, batches, dynamic, budgets, asked_ckpt,
         asked_off, margin, plan_kwargs) -> Plan:
    profile = d.profile
    limit = profile.memory_gb
    util_asked, micro_asked = rollout_asked["gpu_memory_utilization"], rollout_asked["micro_batch_size"]
    per_seq = generation_bytes_per_sequence(model, roles["actor"], rollout, workload.prompt_length,
                                            workload.response_length) / GiB

    def build(offload, ckpt_on, b, budgets_now, util, chunk=None):
        rs = _apply_batches(roles, b, dynamic, budgets_now)
        for name in rs:
            rs[name] = replace(rs[name], gradient_checkpointing=ckpt_on[name], param_offload=offload[name][0],
                               optimizer_offload=offload[name][1])
        ro = replace(rollout, gpu_memory_utilization=util, micro_batch_size=chunk)
        est = estimate_memory(model, workload, rs["actor"], ro, rs.get("critic"), rs.get("ref"),
                              device_memory_gb=limit, backend=profile.backend, fragmentation=margin)
        return rs, ro, est

    def hf_chunk(offload, ckpt_on, b, budgets_now, whole: bool) -> int | None:
        """The built-in engine's chunk: as many sequences as the memory free while generating holds."""
        est = build(offload, ckpt_on, b, budgets_now, 0.0, chunk=1)[2]
        free = est.room_gb(limit) - est.rollout_resident_gb()
        return _chunk_size(max(int(free // per_seq), 0), workload.rollout_batch_per_gpu, micro_asked, whole)

    def vllm_util(offload, ckpt_on, b, budgets_now) -> tuple[float | None, str]:
        """The vLLM share: user's if it fits, else what the other phases leave (None: too little)."""
        est = build(offload, ckpt_on, b, budgets_now, 0.0)[2]
        free = est.room_gb(limit) - est.rollout_resident_gb()
        left = math.floor(100 * free / limit) / 100
        need = _vllm_need_gb(model, workload, rollout.dtype) / limit
        if util_asked is not AUTO:
            u = float(util_asked)
            if u <= left:
                return u, "set by the user; fits next to the resident training state"
            if left >= need:
                return d.adapt("rollout.gpu_memory_utilization", "actor_rollout_ref.rollout.gpu_memory_utilization",
                               u, min(left, 0.9), "that share does not fit next to the training state"), ""
            return None, ""
        if left < need:
            return None, ""
        return min(left, 0.9), "share of device memory left after the resident training state (memory model)"

    ckpt_options = []
    base_ckpt = {n: (asked_ckpt[n] if asked_ckpt[n] is not AUTO else False) for n in roles}
    ckpt_options.append(base_ckpt)
    if any(asked_ckpt[n] is AUTO for n in roles):
        ckpt_options.append({n: (asked_ckpt[n] if asked_ckpt[n] is not AUTO else True) for n in roles})

    def attempt(b: _Batch, budgets_now: dict, whole: bool):
        for rung, offload in _ladder(asked_off, roles):
            for ckpt_on in ckpt_options:
                util, why, chunk = 0.0, "", None
                if rollout.name == "vllm":
                    util, why = vllm_util(offload, ckpt_on, b, budgets_now)
                    if util is None:
                        continue
                else:
                    chunk = hf_chunk(offload, ckpt_on, b, budgets_now, whole)
                    if chunk is None:
                        continue
                rs, ro, est = build(offload, ckpt_on, b, budgets_now, util, chunk)
                if rollout.name != "vllm":
                    engine = sum(v for k, v in est.phases["rollout"].terms.items() if k.startswith("rollout."))
                    util = round(min(engine / limit, 1.0), 3)
                    why = "built-in engine allocates on demand; predicted share of its weights, KV cache and logits"
                    ro = replace(ro, gpu_memory_utilization=util)
                if est.required_gb <= limit:
                    return rung, ckpt_on, rs, ro, est, why
        return None

    def search(whole: bool):
        """Walk the ladder, halving micro-batches until a rung fits; None at the floor."""
        b, bud, halvings = batches, dict(budgets), 0
        while (found := attempt(b, bud, whole)) is None:
            smaller = _halve(b, bud, dynamic, workload.seq_len)
            if smaller is None:
                return None, b, bud, halvings
            b, bud = smaller
            halvings += 1
        return found, b, bud, halvings

    # First keep each training rollout in one pass (offloading for it, as before chunking existed);
    # the built-in engine may then settle for chunked training rollouts.
    found, b, bud, halvings = search(whole=True)
    if found is None and rollout.name == "hf":
        found, b, bud, halvings = search(whole=False)
    if found is None:
        _raise_shortfall(d, model, workload, roles, rollout, b, bud, dynamic, asked_off, margin, limit)

    rung, _, rs, ro, est, util_why = found
    for name, rp in rs.items():
        ck = asked_ckpt[name]
        d.note(f"{name}.gradient_checkpointing", rp.gradient_checkpointing,
               "set by the user" if ck is not AUTO else
               ("activations do not fit without it" if rp.gradient_checkpointing else "activations fit without it"))
        po, oo = asked_off[name]
        d.note(f"{name}.param_offload", rp.param_offload,
               "set by the user" if po is not AUTO else f"memory plan: {rung}")
        d.note(f"{name}.optimizer_offload", rp.optimizer_offload,
               "set by the user" if oo is not AUTO else
               (f"memory plan: {rung}" if name != "ref" else "a frozen model has no optimizer"))
        key = "max_token_len_per_gpu" if dynamic else "micro_batch_size_per_gpu"
        d.note(f"{name}.{key}", getattr(rp, key),
               f"halved {halvings}x to fit (mini-batch unchanged, so the update's math is unchanged)"
               if halvings else "as configured")
    if halvings:
        for name, explicit in b.explicit.items():
            if explicit:
                d.warnings.append(f"{name} micro-batch reduced to fit {profile.name} ({halvings} halvings); "
                                  f"gradient accumulation keeps the mini-batch and the math unchanged.")
                break
    d.note("rollout.gpu_memory_utilization", ro.gpu_memory_utilization, util_why)
    if ro.name == "hf":
        _note_chunk(d, ro.micro_batch_size, micro_asked, est, limit, per_seq, workload)
    for name, rp in rs.items():
        phases = [p for k, p in est.phases.items() if k.startswith(name) or (name == "critic" and k == "values")]
        rs[name] = replace(rp, predicted_peak_gb=round(max(p.total_gb for p in phases), 3))
    ro = replace(ro, predicted_peak_gb=round(est.phases["rollout"].total_gb, 3))
    d.note("memory", round(est.predicted_peak_gb, 3),
           f"peak {est.predicted_peak_gb:.2f} GiB in {est.peak_phase}; with context and {margin:.0%} margin "
           f"{est.required_gb:.2f} of {limit:.1f} GiB ({rung})")
    memory = est.to_dict()
    memory["phases_total"] = {k: {"total_gb": round(p.total_gb, 3)} for k, p in est.phases.items()}
    plan_kwargs.update(actor=rs["actor"], critic=rs.get("critic"), ref=rs.get("ref"), rollout=ro,
                       predicted_peak_gb=round(est.predicted_peak_gb, 3))
    return Plan(reasons=d.reasons, warnings=d.warnings, memory=memory, **plan_kwargs)


def _note_chunk(d: _Decider, chunk: int, asked: Any, est, limit: float, per_seq: float, wl: Workload) -> None:
    """Reason (or adaptation warning) for the built-in engine's chunk size."""
    free = est.room_gb(limit) - est.rollout_resident_gb()
    full = est.rollout_resident_gb() + chunk * per_seq
    sizing = (f"{free:.2f} GiB free while generating / {per_seq * 1024:.1f} MiB per sequence of {wl.seq_len} "
              f"tokens (KV cache, prefill transients, sampling); a full pass peaks at {full:.2f} GiB")
    if asked is AUTO:
        d.note("rollout.micro_batch_size", chunk, f"{chunk} sequences per pass: {sizing}")
    elif asked == chunk:
        d.note("rollout.micro_batch_size", chunk, f"set by the user; {sizing}")
    else:
        d.adapt("rollout.micro_batch_size", "actor_rollout_ref.rollout.micro_batch_size", asked, chunk,
                f"{asked} sequences need {asked * per_seq:.2f} GiB while generating, {free:.2f} GiB are free")


def _halve(b: _Batch, budgets: dict, dynamic: bool, seq_len: int):
    """Next rung of the micro-batch ladder, or None when everything is already at its floor."""
    if dynamic:
        if all(v <= seq_len for v in budgets.values()):
            return None
        return b, {k: max(v // 2, seq_len) for k, v in budgets.items()}
    sizes = [b.actor, b.actor_forward, b.critic, b.critic_forward, b.ref]
    if all(s <= 1 for s in sizes):
        return None
    h = [max(s // 2, 1) for s in sizes]
    return _Batch(*h, explicit=b.explicit), budgets


def _raise_shortfall(d, model, workload, roles, rollout, b, bud, dynamic, asked_off, margin, limit) -> None:
    """Nothing fits: say by how much, and the largest batch / length that would."""
    offload = _ladder(asked_off, roles)[-1][1]
    ck = {n: True for n in roles}

    def required(wl: Workload) -> float:
        rs = _apply_batches(roles, b, dynamic, bud)
        for name in rs:
            rs[name] = replace(rs[name], gradient_checkpointing=ck[name], param_offload=offload[name][0],
                               optimizer_offload=offload[name][1])
        ro = replace(rollout, gpu_memory_utilization=0.0, micro_batch_size=1)   # the engine can chunk to 1
        if rollout.name == "vllm":
            ro = replace(ro, gpu_memory_utilization=_vllm_need_gb(model, wl, rollout.dtype) / limit)
        return estimate_memory(model, wl, rs["actor"], ro, rs.get("critic"), rs.get("ref"),
                               device_memory_gb=limit, backend=d.profile.backend, fragmentation=margin)

    est = required(workload)
    need = est.required_gb
    hint = ""
    batch = workload.rollout_batch_per_gpu
    while batch > 1:
        batch //= 2
        if required(replace(workload, rollout_batch_per_gpu=batch)).required_gb <= limit:
            hint = f" The largest setting that fits: data.train_batch_size <= {batch * workload.world_size} per step."
            break
    if not hint:
        resp = workload.response_length
        while resp > 16:
            resp //= 2
            wl = replace(workload, rollout_batch_per_gpu=1, response_length=resp)
            if required(wl).required_gb <= limit:
                hint = (f" The largest setting that fits: data.train_batch_size=1 with "
                        f"data.max_response_length <= {resp}.")
                break
    if not hint:
        hint = f" Use a device with at least {math.ceil(need)} GiB, or a smaller model."
    raise PlanError(
        f"The run does not fit on {d.profile.name} ({limit:.1f} GiB): even with params and optimizer offloaded, "
        f"gradient checkpointing and micro-batch 1 it needs {need:.2f} GiB (peak in {est.peak_phase}), "
        f"{need - limit:.2f} GiB more than the device has.{hint}")
