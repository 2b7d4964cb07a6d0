"""The planner's rules for what is trained and how frozen weights are stored.

LoRA (`<model>.lora_rank` > 0) trains peft adapters on a frozen base; with a reference policy the
actor serves it too, with its adapters disabled (`Plan.ref_in_actor`, no second model). Weights that
never train (a LoRA base, a reference model) are stored in `frozen_dtype`: float16 where the device
computes in float32 for want of bfloat16 (half the memory, upcast layer by layer), else the compute
dtype. `actor_rollout_ref.model.load_in_4bit` stores the LoRA base in NF4 and
`optim.optimizer_impl=bitsandbytes.optim` + `optimizer=AdamW8bit` keeps AdamW's moments in 8 bits,
both through bitsandbytes where its own support table covers the device.

These rules only read what the user asked: LoRA and QLoRA change what is trained, so the memory fit
never switches them on (it names them when only they would fit, `verl.compat.planning.fit`).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from verl.compat.planning import settings
from verl.compat.planning.decider import Decider, PlanError
from verl.compat.plan import RolePlan

ARR = "actor_rollout_ref"
LORA_KEYS = {"actor": f"{ARR}.model.lora_rank", "critic": "critic.model.lora_rank"}
OPTIM_KEYS = {"actor": f"{ARR}.actor.optim", "critic": "critic.optim"}
LOAD_IN_4BIT = f"{ARR}.model.load_in_4bit"
EIGHT_BIT_ADAMW = ("bitsandbytes.optim", "AdamW8bit")


def lora_rank(config: Any, role: str) -> int:
    """The role's `model.lora_rank` (0: full training); PlanError naming the key when it is not a whole number."""
    key = LORA_KEYS[role]
    value = settings.get(config, key, 0)
    if isinstance(value, bool) or not str(value).strip().isdigit():
        raise PlanError(f"{key}={value!r} must be a whole number >= 0 (0 trains the whole model; e.g. 32 "
                        f"trains LoRA adapters of rank 32).")
    return int(value)


def decide_adapters(decider: Decider, config: Any, roles: dict[str, RolePlan]) -> tuple[dict[str, RolePlan], bool]:
    """LoRA, the 4-bit base, the 8-bit optimizer and the frozen storage dtype of every role; returns
    the roles (the reference dropped when the LoRA actor serves it) and `ref_in_actor`."""
    out = dict(roles)
    for name in ("actor", "critic"):
        if name in out:
            out[name] = _trained_role(decider, config, name, out[name])
    quantized = _decide_4bit(decider, config, out["actor"])
    out["actor"] = replace(out["actor"], base_quantization=quantized)
    ref_in_actor = out["actor"].lora_rank > 0 and "ref" in out
    if ref_in_actor:
        del out["ref"]
        decider.note("ref_in_actor", True, "LoRA actor: reference log-probs come from the actor with its adapters "
                                     "disabled (the frozen base is the reference; no second model)")
    elif "ref" in out:
        decider.note("ref_in_actor", False, "the actor trains every weight: the reference is a separate frozen model")
        out["ref"] = replace(out["ref"], frozen_dtype=_frozen_dtype(decider, config, "ref", out["ref"]))
    return out, ref_in_actor


def _trained_role(decider: Decider, config: Any, name: str, role_plan: RolePlan) -> RolePlan:
    rank = lora_rank(config, name)
    if rank > 0 and decider.software.peft_version is None:
        raise PlanError(f"{LORA_KEYS[name]}={rank} trains LoRA adapters, which are built with peft, and peft is "
                        f"not installed: pip install peft (or set {LORA_KEYS[name]}=0).")
    decider.note(f"{name}.lora_rank", rank, f"set by the user ({LORA_KEYS[name]}): peft adapters of rank {rank} train, "
           "the base weights are frozen" if rank else "full training (model.lora_rank=0)")
    frozen = _frozen_dtype(decider, config, name, role_plan) if rank else None
    return replace(role_plan, lora_rank=rank, frozen_dtype=frozen, optimizer_8bit=_decide_8bit(decider, config, name))


def _frozen_dtype(decider: Decider, config: Any, name: str, role_plan: RolePlan) -> str:
    """Storage dtype of a role's weights that never train (a LoRA base, the reference model)."""
    key = f"{name}.frozen_dtype"
    compute = role_plan.compute_dtype
    if name == "ref":
        asked = settings.get(config, f"{ARR}.ref.fsdp_config.model_dtype")
        if asked is not settings.AUTO:
            return decider.note(key, role_plan.param_dtype, "set by the user (actor_rollout_ref.ref.fsdp_config.model_dtype)")
        if role_plan.numerics_guard:
            return decider.note(key, role_plan.param_dtype, "kept in float32 for the numerics guard's float32 check and fallback")
    if decider.profile.backend == "cpu":
        return decider.note(key, compute, "CPU: frozen weights stay in the float32 the CPU computes in (no per-layer "
                                    "upcast on every pass)")
    if compute == "float32":
        return decider.note(key, "float16", f"{compute} compute for want of bfloat16 ({decider.profile.name}): frozen weights are "
                                      "stored in float16 (half the memory) and upcast to float32 layer by layer")
    why = f"stored in the {compute} they compute in: weights that never train need no float32 copy"
    if role_plan.numerics_guard:
        why += ("; the numerics guard's float32 check and fallback upcast the same stored weights, so the "
                "reference (the base without adapters) stays consistent")
    return decider.note(key, compute, why)


def _decide_4bit(decider: Decider, config: Any, actor: RolePlan) -> str | None:
    """"nf4" when the user asks for a 4-bit LoRA base (QLoRA) and bitsandbytes supports it here."""
    asked = settings.flag(settings.get(config, LOAD_IN_4BIT, False))
    if not asked:
        return decider.note("actor.base_quantization", None, f"{LOAD_IN_4BIT}=false: the frozen base is stored in "
                      f"{actor.frozen_dtype or actor.param_dtype}")
    if actor.lora_rank == 0:
        raise PlanError(f"{LOAD_IN_4BIT}=true quantizes the frozen base of a LoRA model, and "
                        f"{LORA_KEYS['actor']}=0 trains every weight: set {LORA_KEYS['actor']} (e.g. 32) or "
                        f"{LOAD_IN_4BIT}=false.")
    ranks = int(settings.get(config, "trainer.n_gpus_per_node", 1)) * int(settings.get(config, "trainer.nnodes", 1))
    why = decider.bnb_missing("nf4")
    if why is None and ranks > 1:
        why = f"a 4-bit base runs on one device, unwrapped, and this run has {ranks} ranks (FSDP2 shards no 4-bit weights)"
    if why is not None:
        decider.adapt("actor.base_quantization", LOAD_IN_4BIT, True, False, why)
        return None
    return decider.note("actor.base_quantization", "nf4", f"set by the user ({LOAD_IN_4BIT}=true): the frozen base's "
                  f"linear layers are stored in 4-bit NF4 by bitsandbytes and compute in {actor.compute_dtype}; "
                  f"embeddings and norms stay in {actor.frozen_dtype}")


def _decide_8bit(decider: Decider, config: Any, name: str) -> bool:
    """Whether the role's AdamW keeps its moments in 8 bits (the user's bitsandbytes.optim.AdamW8bit)."""
    optim = OPTIM_KEYS[name]
    impl = str(settings.get(config, f"{optim}.optimizer_impl", "torch.optim"))
    opt = str(settings.get(config, f"{optim}.optimizer", "AdamW"))
    if (impl, opt) == ("torch.optim", "AdamW"):
        return decider.note(f"{name}.optimizer_8bit", False, "torch.optim.AdamW: float32 moments")
    if (impl, opt) != EIGHT_BIT_ADAMW:
        raise PlanError(f"{optim}.optimizer_impl={impl} with {optim}.optimizer={opt}: this fork builds AdamW from "
                        f"torch.optim, or AdamW8bit from bitsandbytes.optim; set one of those pairs.")
    why = decider.bnb_missing("adamw8bit")
    ranks = int(settings.get(config, "trainer.n_gpus_per_node", 1)) * int(settings.get(config, "trainer.nnodes", 1))
    if why is None and ranks > 1:
        why = (f"bitsandbytes' 8-bit AdamW steps plain tensors, not FSDP2's sharded ones, and this run has {ranks} "
               "ranks")
    if why is not None:
        decider.adapt(f"{name}.optimizer_8bit", f"{optim}.optimizer_impl", "bitsandbytes.optim (AdamW8bit)",
                "torch.optim (AdamW)", why)
        return False
    return decider.note(f"{name}.optimizer_8bit", True, f"set by the user ({optim}: bitsandbytes.optim.AdamW8bit): "
                  "AdamW's two moments are kept in 8 bits (block-wise quantized), a quarter of float32's memory")


def keep_bitsandbytes_on_device(decider: Decider, roles: dict[str, RolePlan], asked_off: dict, fsdp_prefix: dict) -> None:
    """A user's `param_offload=true` on a role whose weights or optimizer bitsandbytes holds is adapted
    to false: a 4-bit base runs unwrapped on the device and 8-bit AdamW has no host step."""
    for name, role_plan in roles.items():
        asked_params, asked_optimizer = asked_off[name]
        if asked_params is True and (role_plan.base_quantization or role_plan.optimizer_8bit):
            what = "the 4-bit base runs unwrapped on the device" if role_plan.base_quantization else \
                "bitsandbytes' 8-bit AdamW steps on the device only (no host implementation)"
            asked_off[name] = (decider.adapt(f"{name}.param_offload", f"{fsdp_prefix[name]}.param_offload", True, False,
                                       what), asked_optimizer)
