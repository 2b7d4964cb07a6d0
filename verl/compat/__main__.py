"""The doctor: `python -m verl.compat [--device NAME] [--json] [--model-spec NAME|FILE] [overrides...]`.

Composes the config exactly as main_ppo does (same Hydra overrides, same checks), then prints the
device profile, the installed software with its verdicts, and the plan with a reason per decision.
`--json` prints one JSON object on stdout and nothing else (logs go to stderr).

The model's sizes come from `actor_rollout_ref.model.path`'s config.json. Planning without the
model on disk needs `--model-spec`: a config.json path, or one of the built-in shapes below
(`qwen2.5-0.5b` is the field report's model). Without either the doctor stops with an error,
because a plan sized for a guessed model would be wrong.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
from dataclasses import asdict

from omegaconf import OmegaConf

from verl.compat.planning.decider import PlanError
from verl.compat.planning.model_spec import BUILTIN_MODELS


def _parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(
        prog="python -m verl.compat",
        description="Show the device, the installed software and the hardware plan for a config.")
    parser.add_argument("--device", help="plan as if on this catalog device (e.g. p40, t4, a100-40gb)")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    parser.add_argument("--model-spec", metavar="NAME|FILE",
                        help=f"model shape when the model is not on disk: a config.json path or one "
                             f"of {', '.join(BUILTIN_MODELS)}")
    parser.add_argument("--largest", action="store_true",
                        help="print, for every catalog GPU, the largest built-in model each training mode fits "
                             "(full, full + offload, LoRA, QLoRA) for this config, as a markdown table "
                             "(--device a,b limits it to those devices)")
    return parser.parse_known_args(argv)


def _model_spec(name: str | None):
    from verl.compat.planning.model_spec import ModelSpec

    if name is None:
        return None
    if os.path.exists(os.path.expanduser(name)):
        return ModelSpec.from_pretrained(name)
    key = name.strip().lower().removesuffix("-instruct")
    if key not in BUILTIN_MODELS:
        raise ValueError(f"--model-spec '{name}' is neither a config.json path nor a built-in "
                         f"model ({', '.join(BUILTIN_MODELS)}).")
    return ModelSpec.from_hf_config(BUILTIN_MODELS[key])


def config_and_model(overrides: list[str], device: str | None = None, model_spec: str | None = None,
                     check: bool = True):
    """(config, model) for main_ppo-style overrides, the device to plan for set in `compat.device`.
    `--device` names one device of a kind: unless the overrides set `trainer.n_gpus_per_node` /
    `trainer.nnodes`, the plan is for one of them (upstream's default is 8 per node)."""
    from omegaconf import open_dict

    from verl import compat
    from verl.trainer.config_check import load_config

    if device and not any(o.lstrip("+").startswith(("trainer.n_gpus_per_node", "trainer.nnodes")) for o in overrides):
        overrides = ["trainer.n_gpus_per_node=1", "trainer.nnodes=1", *overrides]
    config = load_config(overrides, check=check)
    if device:
        with open_dict(config):
            config.compat.device = device
    return config, _model_spec(model_spec) or compat.model_spec_for(config)


def plan_for(overrides: list[str], device: str | None = None, model_spec: str | None = None):
    """(config, model, plan) for main_ppo-style overrides: the doctor's work without the printing."""
    from verl import compat

    config, model = config_and_model(overrides, device, model_spec)
    return config, model, compat.build_plan(config, model=model, to_run=False)


def mode_report(config, model) -> tuple:
    """(profile, rows): what full, full + offload, LoRA and QLoRA training would need on the planned
    device (`verl.compat.planning.modes`)."""
    from verl import compat
    from verl.compat.planning.modes import mode_rows
    from verl.compat.planning.settings import get

    profile = compat.detect_profile(compat.simulate_name(get(config, "compat.device", None)))
    return profile, mode_rows(profile, config, compat.detect_software(profile, probe_xformers=False), model)


# How to switch on a role the config leaves off, to show what it would be planned as.
_ROLE_SWITCHES = {"critic": ("critic.enable", True), "ref": ("algorithm.use_kl_in_reward", True)}


def doctor_json(config, model, plan) -> dict:
    """The plan as one JSON-ready dict. Every role appears with `enabled`; a role this config does
    not use (the critic under GRPO, the reference model without KL) shows the settings it would be
    planned with if switched on, so the answer for a device is complete either way."""
    from omegaconf import open_dict

    from verl import compat

    out = plan.to_dict()
    out["modes"] = [asdict(row) for row in mode_report(config, model)[1]]
    for name, role in (("actor", plan.actor), ("critic", plan.critic), ("ref", plan.ref)):
        if role is not None:
            out[name]["enabled"] = True
            continue
        key, value = _ROLE_SWITCHES[name]
        probe = config.copy()
        with open_dict(probe):
            OmegaConf.update(probe, key, value, force_add=True)
        try:
            probed = compat.make_plan(plan.device, probe, plan.software, model)
        except (ValueError, PlanError) as err:   # switched on, the run would not fit: say so instead
            out[name] = {"enabled": False, "error": str(err)}
            continue
        shown = getattr(probed, name)
        if shown is None:   # a LoRA actor serves the reference itself (its adapters disabled): no model of its own
            out[name] = {"enabled": False, "served_by_actor": bool(probed.ref_in_actor)}
            continue
        out[name] = dict(asdict(shown), enabled=False)
    return out


def format_memory(memory: dict, limit_gb: float) -> str:
    """The memory model's breakdown: each phase's total and its terms, the peak and what it needs."""
    phases = memory.get("phases") or {}
    if not phases:
        return ""
    lines = ["  memory    GiB per device at each phase's peak"]
    for name, terms in phases.items():
        mark = "  <- peak" if name == memory.get("peak_phase") else ""
        lines.append(f"    {name:30s} {sum(terms.values()):8.2f}{mark}")
        lines += [f"      {term:28s} {gb:8.3f}" for term, gb in terms.items() if gb >= 0.0005]
    lines.append(f"    required {memory['required_gb']:.2f} GiB = peak {memory['predicted_peak_gb']:.2f} in "
                 f"{memory['peak_phase']} x (1 + {memory['fragmentation']:.0%} margin) + "
                 f"{memory['context_gb']:.2f} context; the device has {limit_gb:.2f}")
    return "\n".join(lines)


def _text_report(config, model, plan) -> str:
    from verl import compat

    memory = format_memory(plan.memory, plan.memory_limit_gb)
    return compat.format_plan(plan) + (f"\n\n{memory}" if memory else "") + "\n\n" + _modes_text(config, model)


def _modes_text(config, model) -> str:
    from verl.compat.planning.modes import format_modes

    profile, rows = mode_report(config, model)
    return format_modes(rows, profile)


def _device_report(device: str | None) -> str | None:
    """The device and its software verdicts, which need no config; None if detection itself fails."""
    from verl import compat

    try:
        profile = compat.detect_profile(compat.simulate_name(device))
        return "\n".join(["verl.compat device", *compat.format_device(profile, compat.detect_software(profile))])
    except (ValueError, RuntimeError):
        return None


def _largest(overrides: list[str], devices: list[str] | None) -> int:
    """`--largest [--device a,b]`: the table (every catalog GPU, or those named), planned with the installed
    software (peft and bitsandbytes assumed where missing, as the modes are)."""
    from verl import compat
    from verl.compat.planning.modes import largest_table
    from verl.trainer.config_check import load_config

    config = load_config(overrides)
    print(largest_table(config, compat.detect_software(compat.detect_profile("cpu"), probe_xformers=False), devices))
    return 0


def _print_modes_after(error: Exception, config, model, overrides: list[str], args) -> None:
    """After a refusal, what each training mode would need; after a config error, the same for the
    config as composed (the planner fills what the checks asked for with its defaults)."""
    from verl.compat.planning.decider import PlanError
    from verl.trainer.config_check import ConfigError

    if isinstance(error, ConfigError):
        try:
            config, model = config_and_model(overrides, args.device, args.model_spec, check=False)
        except (FileNotFoundError, ValueError, RuntimeError):
            return
        print("\n(the config as composed, its errors above left to the planner's defaults)")
    elif not isinstance(error, PlanError) or model is None:
        return
    try:
        print("\n" + _modes_text(config, model))
    except (FileNotFoundError, ValueError, RuntimeError):
        return


def main(argv: list[str] | None = None) -> int:
    from verl import compat

    args, overrides = _parse(sys.argv[1:] if argv is None else argv)
    if args.largest:
        return _largest(overrides, args.device.split(",") if args.device else None)
    config = model = None
    try:
        with contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext():
            config, model = config_and_model(overrides, args.device, args.model_spec)
            plan = compat.build_plan(config, model=model, to_run=False)
            report = doctor_json(config, model, plan) if args.json else _text_report(config, model, plan)
    except (FileNotFoundError, ValueError, RuntimeError) as err:
        # Without a plan the device and software verdicts still answer "what can this machine do?".
        device = None if args.json else _device_report(args.device)
        if device:
            print(device + "\n")
        hint = " Or give the doctor the model's shape: --model-spec NAME|FILE." \
            if isinstance(err, FileNotFoundError) else ""
        print(f"error: no plan for this config:\n{err}{hint}", file=sys.stderr)
        if not args.json:
            _print_modes_after(err, config, model, overrides, args)
        return 2
    print(json.dumps(report, indent=2, sort_keys=True) if args.json else report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
