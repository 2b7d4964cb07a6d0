"""What each training mode would need on a device: full, full with offload, LoRA, QLoRA.

LoRA and QLoRA change what is trained, so the planner never switches them on by itself. This module
only answers "what if": when full training does not fit, the refusal names the LoRA (then QLoRA)
setting that would and its predicted peak (`lever_hint`); the doctor shows every mode for the
user's config (`mode_rows`), and the docs' table of the largest model per device and mode comes from
`largest_models`. Each answer is the real planner run on the config with the mode's keys set.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from verl.compat.planning import settings
from verl.compat.device.support import bitsandbytes_missing
from verl.compat.planning.decider import PlanError
from verl.compat.planning.lora import LOAD_IN_4BIT, LORA_KEYS, lora_rank
from verl.compat.planning.model_spec import BUILTIN_MODELS, ModelSpec
from verl.compat.device.profile import DeviceProfile, SoftwareInfo

LEVER_RANK = 32   # the rank named when the user has none (upstream's LoRA recipes use 32)
MODES = ("full", "full + offload", "LoRA", "QLoRA")
_OFFLOAD_KEYS = tuple(f"{prefix}.{leaf}" for prefix in ("actor_rollout_ref.actor.fsdp_config",
                                                        "actor_rollout_ref.ref.fsdp_config", "critic.fsdp")
                      for leaf in ("param_offload", "optimizer_offload"))
# what a device's mode is planned with when the package is missing here: the memory question only
_ASSUMED_PEFT, _ASSUMED_BNB = "assumed", "0.48.0"


@dataclass
class ModeRow:
    mode: str
    overrides: dict            # the keys the mode sets on the user's config
    fits: bool
    peak_gb: float | None = None
    peak_phase: str = ""
    settings: str = ""         # what the plan chose (offload, checkpointing, micro-batches)
    why_not: str = ""          # the refusal, or why the mode cannot run here at all
    needs: str = ""            # packages this machine lacks for the mode


def mode_overrides(config: Any, mode: str) -> dict:
    """The keys `mode` sets on top of the user's config."""
    rank = lora_rank(config, "actor") or LEVER_RANK
    if mode == "full":
        return {LORA_KEYS["actor"]: 0, LOAD_IN_4BIT: False, **{key: False for key in _OFFLOAD_KEYS}}
    if mode == "full + offload":
        return {LORA_KEYS["actor"]: 0, LOAD_IN_4BIT: False}
    # a critic (GAE) trains adapters of the same rank unless the user gave it its own
    critic = {LORA_KEYS["critic"]: lora_rank(config, "critic") or rank} if _has_critic(config) else {}
    return {LORA_KEYS["actor"]: rank, LOAD_IN_4BIT: mode == "QLoRA", **critic}


def _has_critic(config: Any) -> bool:
    enabled = settings.flag(settings.get(config, "critic.enable"))
    return settings.get(config, "algorithm.adv_estimator", "gae") == "gae" if enabled is settings.AUTO else bool(enabled)


def _software_for(mode: str, software: SoftwareInfo) -> tuple[SoftwareInfo, str]:
    """The software to plan `mode` with (missing packages assumed, to answer the memory question) and
    what this machine would have to install."""
    if mode.startswith("full"):
        return software, ""
    missing = [] if software.peft_version else ["peft"]
    if mode == "QLoRA" and not software.bitsandbytes_version:
        missing.append("bitsandbytes")
    assumed = replace(software, peft_version=software.peft_version or _ASSUMED_PEFT,
                      bitsandbytes_version=software.bitsandbytes_version or _ASSUMED_BNB)
    return assumed, (f"pip install {' '.join(missing)}" if missing else "")


def plan_mode(profile: DeviceProfile, config: Any, software: SoftwareInfo, model: ModelSpec, mode: str) -> ModeRow:
    """The real planner on the user's config with `mode`'s keys set."""
    from verl.compat.planning.planner import make_plan

    overrides = mode_overrides(config, mode)
    mode_software, needs = _software_for(mode, software)
    if mode == "QLoRA" and (why := bitsandbytes_missing(profile, mode_software.bitsandbytes_version, "nf4")) is not None:
        return ModeRow(mode, overrides, False, why_not=why)
    strict = settings.with_values(config, {**overrides, "compat.strict": False})
    try:
        plan = make_plan(profile, strict, mode_software, model, levers=False)
    except PlanError as err:
        return ModeRow(mode, overrides, False, why_not=str(err), needs=needs)
    if mode == "QLoRA" and plan.actor.base_quantization is None:   # adapted away (e.g. several ranks)
        return ModeRow(mode, overrides, False, why_not=plan.reasons["actor.base_quantization"], needs=needs)
    return ModeRow(mode, overrides, True, plan.predicted_peak_gb, plan.memory.get("peak_phase", ""),
                   describe(plan), needs=needs)


def describe(plan) -> str:
    """The actor's memory settings in a plan, in a few words."""
    a = plan.actor
    batch = (f"micro-batch {a.micro_batch_size_per_gpu}" if a.micro_batch_size_per_gpu is not None
             else f"{a.max_token_len_per_gpu}-token budget")
    offload = "params + optimizer offloaded" if a.param_offload else (
        "optimizer offloaded" if a.optimizer_offload else "nothing offloaded")
    base = ""
    if a.lora_rank:
        base = f"LoRA r={a.lora_rank} on a {'4-bit' if a.base_quantization else a.frozen_dtype} base, "
    return f"{base}{offload}, checkpointing {'on' if a.gradient_checkpointing else 'off'}, {batch}"


def mode_rows(profile: DeviceProfile, config: Any, software: SoftwareInfo, model: ModelSpec) -> list[ModeRow]:
    return [plan_mode(profile, config, software, model, mode) for mode in MODES]


def lever_hint(profile: DeviceProfile, config: Any, software: SoftwareInfo, model: ModelSpec) -> str:
    """For a refusal: the first of LoRA, QLoRA (beyond what the user asked) that would fit, as the keys
    to set and the peak it would have; '' when none would."""
    asked_lora = lora_rank(config, "actor") > 0
    asked_4bit = bool(settings.flag(settings.get(config, LOAD_IN_4BIT, False)))
    tries = [] if asked_lora else ["LoRA"]
    tries += [] if asked_4bit else ["QLoRA"]
    for mode in tries:
        row = plan_mode(profile, config, software, model, mode)
        if not row.fits:
            continue
        keys = " ".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in row.overrides.items()
                        if not (k == LOAD_IN_4BIT and v is False))
        needs = f" (needs {row.needs.removeprefix('pip install ')} installed)" if row.needs else ""
        return (f" {mode} would fit: {keys}{needs}, predicted peak {row.peak_gb:.2f} GiB in {row.peak_phase} "
                f"({row.settings}). It trains adapters instead of every weight, so compat does not switch it on "
                f"by itself.")
    return ""


def format_modes(rows: list[ModeRow], profile: DeviceProfile) -> str:
    """The doctor's per-mode block."""
    lines = [f"  modes     what each training mode needs on {profile.name} ({profile.memory_gb:.1f} GiB) "
             "for this config"]
    for row in rows:
        keys = " ".join(f"{k}={v}" for k, v in row.overrides.items() if k in (LORA_KEYS["actor"], LOAD_IN_4BIT))
        if row.fits:
            what = f"fits: peak {row.peak_gb:.2f} GiB in {row.peak_phase}; {row.settings}"
        else:
            what = "does not fit: " + row.why_not.replace("\n", " ")
        needs = f" [{row.needs}]" if row.needs else ""
        lines.append(f"    {row.mode:15s} {what}{needs}\n    {'':15s} ({keys})")
    return "\n".join(lines)


def largest_models(profile: DeviceProfile, config: Any, software: SoftwareInfo) -> dict[str, str | None]:
    """Mode -> the largest catalog model (`BUILTIN_MODELS`, by size) the planner fits on `profile`."""
    specs = sorted(((name, ModelSpec.from_hf_config(cfg)) for name, cfg in BUILTIN_MODELS.items()),
                   key=lambda item: item[1].num_params)
    out = {}
    for mode in MODES:
        fitting = [name for name, spec in specs if plan_mode(profile, config, software, spec, mode).fits]
        out[mode] = fitting[-1] if fitting else None
    return out


def largest_table(config: Any, software: SoftwareInfo, devices: list[str] | None = None) -> str:
    """Markdown: for each catalog GPU, the largest catalog model each mode fits (the docs' table)."""
    from verl.compat.device.catalog import CATALOG

    names = devices or [name for name, p in CATALOG.items() if p.backend != "cpu"]
    lines = [f"| device | {' | '.join(MODES)} |", "|---|" + "---|" * len(MODES)]
    for name in names:
        best = largest_models(CATALOG[name], config, software)
        lines.append(f"| {name} | " + " | ".join(best[m] or "none" for m in MODES) + " |")
    return "\n".join(lines)
