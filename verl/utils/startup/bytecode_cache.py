"""A bytecode cache for runs where the environment switched Python's off.

Container images often set PYTHONDONTWRITEBYTECODE=1 and install packages without their .pyc files.
Python then compiles every module it imports from source, in every process, every run: the driver,
each worker and each of Ray's daemons compile torch again, which can double a run's cold start
(figures: docs/performance.md, "Cold start").

When that is the case, `configure()` (called first thing by the `main_ppo` entry point) caches
bytecode in a folder of its own (PYTHONPYCACHEPREFIX), never next to the sources, which is what
PYTHONDONTWRITEBYTECODE is normally set to prevent. The driver uses it from then on and every process
it starts inherits it. `VERL_PYCACHE=off` leaves Python as it is; `VERL_PYCACHE=<folder>` picks the
folder (and turns the cache on even where Python would write its own).
"""
from __future__ import annotations

import importlib.util
import os
import sys
from dataclasses import dataclass

from verl.utils.startup import SWITCH, tricks_enabled

SETTING = "VERL_PYCACHE"
# Packages whose start-up cost dominates every process of a run; if they ship bytecode, so does the rest.
HEAVY_PACKAGES = ("torch", "transformers", "ray")


@dataclass(frozen=True)
class BytecodeCache:
    """Where this run caches bytecode (None: Python's own behaviour) and why."""

    folder: str | None
    reason: str


def cache_dir(name: str) -> str:
    """`~/.cache/verl/<name>` (`$XDG_CACHE_HOME/verl/<name>`): where verl keeps what it caches between runs."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "verl", name)


def default_folder() -> str:
    return cache_dir("pycache")


def uncached_packages(names=HEAVY_PACKAGES) -> list[str]:
    """The installed packages among `names` whose top module has no .pyc beside it (found, not imported)."""
    missing = []
    for name in names:
        spec = importlib.util.find_spec(name)
        origin = getattr(spec, "origin", None) or ""
        if origin.endswith(".py") and not os.path.exists(importlib.util.cache_from_source(origin)):
            missing.append(name)
    return missing


def decide(setting: str | None, dont_write: bool, prefix: str | None, uncached: list[str],
           folder: str) -> BytecodeCache:
    """Pure decision from the user's setting, Python's flags and which heavy packages lack bytecode."""
    setting = (setting or "").strip()
    if setting.lower() in ("off", "0", "false", "no"):
        return BytecodeCache(None, f"{SETTING}={setting}: Python's bytecode settings left as they are")
    if prefix:
        return BytecodeCache(None, f"Python already caches bytecode in {prefix} (PYTHONPYCACHEPREFIX)")
    if setting:
        return BytecodeCache(setting, f"{SETTING}={setting}: caching bytecode there")
    if not dont_write:
        return BytecodeCache(None, "Python writes its own bytecode cache")
    if not uncached:
        return BytecodeCache(None, "PYTHONDONTWRITEBYTECODE is set, but torch, transformers and ray ship their bytecode")
    return BytecodeCache(folder, f"PYTHONDONTWRITEBYTECODE is set and {', '.join(uncached)} ship no .pyc, so every "
                                 f"process would compile them from source each run: caching bytecode in {folder} "
                                 f"({SETTING}=off leaves Python as it is)")


def _usable(folder: str) -> bool:
    try:
        os.makedirs(folder, exist_ok=True)
    except OSError:
        return False
    return os.access(folder, os.W_OK)


_ENABLED: str | None = None   # the folder enable() turned on in this process


def enable(folder: str) -> None:
    """Cache bytecode in `folder` in this process and in every process started from it from now on."""
    global _ENABLED
    _ENABLED = folder
    sys.pycache_prefix = folder
    sys.dont_write_bytecode = False
    os.environ["PYTHONPYCACHEPREFIX"] = folder
    os.environ["PYTHONDONTWRITEBYTECODE"] = ""    # empty counts as unset


def worker_env() -> dict[str, str]:
    """The variables a worker needs to share this process's cache (for a cluster that does not inherit
    this process's environment); empty when enable() did not run here."""
    if _ENABLED is None:
        return {}
    return {"PYTHONPYCACHEPREFIX": _ENABLED, "PYTHONDONTWRITEBYTECODE": ""}


def configure(packages=HEAVY_PACKAGES) -> BytecodeCache:
    """Decide (judging by `packages`), turn the cache on where decided, and say so on stderr when it does."""
    if not tricks_enabled():
        return BytecodeCache(None, f"{SWITCH}=0: Python's bytecode settings left as they are")
    choice = decide(os.environ.get(SETTING), bool(sys.flags.dont_write_bytecode or sys.dont_write_bytecode),
                    os.environ.get("PYTHONPYCACHEPREFIX") or sys.pycache_prefix, uncached_packages(packages),
                    default_folder())
    if choice.folder is None:
        return choice
    if not _usable(choice.folder):
        choice = BytecodeCache(None, f"{choice.folder} cannot be written, so every process keeps compiling its "
                                     f"imports from source: point {SETTING} at a writable folder")
        print(f"verl: bytecode: {choice.reason}", file=sys.stderr, flush=True)
        return choice
    enable(choice.folder)
    print(f"verl: bytecode: {choice.reason}", file=sys.stderr, flush=True)
    return choice
