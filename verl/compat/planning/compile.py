"""When the compiled code is built (`compat.compile_warmup`) and where it is kept (`compat.compile_cache_dir`).

The plan's torch_compile compiles the decoder layers, the log-prob kernels and the rollout's decode step;
built before the first step, that is most of a fresh machine's first minute. By default it is built there
(`synchronous`), as torch.compile does by itself. The alternative, `background`, runs the first step eagerly
and alone, then builds the compiled code on a side thread beside the next eager steps
(verl/utils/compile_beside.py), switching to it where a pass begins (on every rank at the same pass); the
side thread and the eager steps share one interpreter, so those steps run slower than eager code alone
(docs/performance.md, "Compile off the critical path", has what each mode measured). `background` is the
user's to ask for; it is refused where the eager first steps would not fit (eager layers keep more for
backward than compiled ones: the memory model's `compiled_layers`) or where a layer runs collectives inside
its compiled region (Ulysses' all-to-all attention). `off` compiles nothing. Either way inductor's cache is
kept per torch version and device, so a second run on the machine loads the generated code instead of
generating it.
"""
from __future__ import annotations

import re
from typing import Any, Callable

from verl.compat.planning import settings
from verl.compat.planning.decider import Decider
from verl.compat.planning.settings import AUTO

WARMUPS = ("background", "synchronous", "off")
CACHE_ROOT = "~/.cache/verl/compile"


def asked_warmup(config: Any) -> Any:
    """`compat.compile_warmup` as one of WARMUPS, or AUTO."""
    asked = settings.get(config, "compat.compile_warmup")
    return asked if asked is AUTO else str(asked).strip().lower()


def default_cache_dir(torch_version: str, device_name: str) -> str:
    """~/.cache/verl/compile/torch-<version>-<device>: generated code is valid for one torch and one device."""
    tag = re.sub(r"[^A-Za-z0-9.+_-]+", "-", f"torch-{torch_version}-{device_name}").strip("-").lower()
    return f"{CACHE_ROOT}/{tag}"


def decide_cache_dir(decider: Decider, config: Any, torch_compile: bool) -> str | None:
    """The inductor cache folder the workers use (None: torch's own default, or nothing compiled)."""
    asked = settings.get(config, "compat.compile_cache_dir")
    if not torch_compile:
        return decider.note("compile_cache_dir", None, "nothing is compiled")
    if asked is not AUTO:
        return decider.note("compile_cache_dir", str(asked), "set by the user")
    folder = default_cache_dir(decider.software.torch_version, decider.profile.name)
    return decider.note("compile_cache_dir", folder, "per torch version and device: a second run here loads the "
                        "generated code instead of generating it")


def decide_compile_warmup(decider: Decider, config: Any, torch_compile: bool, roles: dict,
                          eager_required_gb: Callable[[], float | None]) -> str:
    """background | synchronous | off, with its reason. `roles`: the fitted role plans by name;
    `eager_required_gb`: the fitted plan's required memory with eager layers (None without a model)."""
    asked = asked_warmup(config)
    key = "compat.compile_warmup"
    if not torch_compile:
        return decider.note("compile_warmup", "off", "nothing is compiled (see torch_compile)")
    if asked == "off":   # the planner turned torch_compile off for it; reached only when the user forced it on
        return decider.adapt("compile_warmup", key, "off", "synchronous",
                             "actor_rollout_ref.actor.use_torch_compile=true asks for compiled code")
    if asked != "background":
        return decider.note("compile_warmup", "synchronous", ("set by the user: " if asked == "synchronous" else "")
                            + "compiled before the first step, so every step runs compiled code (`background` would "
                            "run the first step eagerly and build beside the next ones)")
    blocker = _background_blocker(decider, roles, eager_required_gb)
    if blocker is not None:
        return decider.adapt("compile_warmup", key, "background", "synchronous", blocker)
    return decider.note("compile_warmup", "background", "set by the user: the first step runs eagerly and alone, "
                        "then a side thread builds the compiled code beside the next eager steps; it takes over at the "
                        "start of a pass once built")


def _background_blocker(decider: Decider, roles: dict, eager_required_gb: Callable[[], float | None]) -> str | None:
    if any(r.sequence_parallel_size > 1 for r in roles.values()):
        return "Ulysses runs its all-to-all attention inside the compiled layers, which a side thread cannot build alone"
    need = eager_required_gb()
    if need is not None and need > decider.profile.memory_gb:
        return (f"eager first steps would need {need:.1f} GiB of {decider.profile.memory_gb:.1f} (eager layers keep "
                "more for backward than compiled ones, and the side thread's copies of their inputs wait for the build)")
    return None
