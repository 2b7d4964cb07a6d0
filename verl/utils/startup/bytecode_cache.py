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

An empty folder (a fresh machine) is filled beside the run: a low-priority `compileall` over the heavy
packages on the host's spare cores (`fill_beside`), so the driver's and the workers' imports mostly find
bytecode already written instead of compiling it one module at a time on one core. `VERL_PYCACHE_FILL=off`
leaves the folder to fill as imports go.
"""
from __future__ import annotations

import atexit
import importlib.util
import os
import signal
import subprocess
import sys
from dataclasses import dataclass

from verl.utils.startup import SWITCH, tricks_enabled

SETTING = "VERL_PYCACHE"
FILL_SETTING = "VERL_PYCACHE_FILL"
# Packages whose start-up cost dominates every process of a run; if they ship bytecode, so does the rest.
HEAVY_PACKAGES = ("torch", "transformers", "ray")
# What the fill compiles: the heavy packages and sympy (torch.compile's symbolic shapes), minus the folders no run
# imports from (test suites, ONNX export, transformers' ~400 model families: a run loads one, as it goes).
FILL_PACKAGES = ("torch", "transformers", "ray", "sympy")
FILL_SKIP = r"/(tests?|testing|_testing|onnx)/|/transformers/models/(?!auto/)"
# The fill runs only where it leaves cores to the run: compileall takes the host's cores but these.
FILL_MIN_CPUS = 8
FILL_SPARE_CPUS = 2


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


def _top_sources(names) -> dict[str, str]:
    """Each installed package's top module source among `names` (found, not imported)."""
    origins = {name: getattr(importlib.util.find_spec(name), "origin", None) or "" for name in names}
    return {name: origin for name, origin in origins.items() if origin.endswith(".py")}


def uncached_packages(names=HEAVY_PACKAGES) -> list[str]:
    """The installed packages among `names` whose top module has no .pyc beside it (found, not imported)."""
    return [name for name, source in _top_sources(names).items()
            if not os.path.exists(importlib.util.cache_from_source(source))]


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
_FILL: subprocess.Popen | None = None   # the compileall fill_beside() started, if any


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


def fill_workers(cpus: int, cold: bool, setting: str | None = None) -> int:
    """How many processes fill an empty cache (0: no fill): on a host of FILL_MIN_CPUS or more, all
    cores but FILL_SPARE_CPUS, unless `setting` (VERL_PYCACHE_FILL) is off; a cache that already holds
    bytecode is left to fill itself as imports go."""
    if (setting or "").strip().lower() in ("off", "0", "false", "no"):
        return 0
    return max(cpus - FILL_SPARE_CPUS, 1) if cold and cpus >= FILL_MIN_CPUS else 0


def _is_cold(folder: str, packages=HEAVY_PACKAGES) -> bool:
    """True when `folder` holds no bytecode for any of `packages`' top modules (found, not imported)."""
    return not any(os.path.exists(_cached_path(source, folder)) for source in _top_sources(packages).values())


def _cached_path(source: str, folder: str) -> str:
    """Where an import caching bytecode in `folder` keeps `source`'s."""
    kept, sys.pycache_prefix = sys.pycache_prefix, folder
    try:
        return importlib.util.cache_from_source(source)
    finally:
        sys.pycache_prefix = kept


def _package_dirs(packages=FILL_PACKAGES) -> list[str]:
    dirs = []
    for name in packages:
        spec = importlib.util.find_spec(name)
        dirs += list(getattr(spec, "submodule_search_locations", None) or [])
    return dirs


def fill_beside(folder: str, workers: int, packages=FILL_PACKAGES) -> subprocess.Popen | None:
    """Start compiling `packages` into `folder` with `workers` processes, at low priority, beside this run;
    stopped when this process exits. Both sides write each .pyc atomically, so an import and the fill
    may race on a module harmlessly. Returns the process (None: nothing to compile)."""
    dirs = _package_dirs(packages)
    if not dirs or workers <= 0:
        return None
    command = [sys.executable, "-X", f"pycache_prefix={folder}", "-m", "compileall", "-q", "-j", str(workers),
               "-x", FILL_SKIP, *dirs]
    global _FILL
    _FILL = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             start_new_session=True, preexec_fn=lambda: os.nice(10))
    atexit.register(_stop, _FILL)
    return _FILL


def _stop(fill: subprocess.Popen) -> None:
    if fill.poll() is None:
        try:
            os.killpg(fill.pid, signal.SIGTERM)   # compileall and its pool
        except OSError:
            pass


def configure(packages=HEAVY_PACKAGES, fill_packages=FILL_PACKAGES) -> BytecodeCache:
    """Decide (judging by `packages`), turn the cache on where decided, fill an empty one with `fill_packages`
    beside the run (`fill_workers`), and say so on stderr when it does."""
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
    workers = fill_workers(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1,
                           _is_cold(choice.folder, packages), os.environ.get(FILL_SETTING))
    enable(choice.folder)
    reason = choice.reason
    if workers and fill_beside(choice.folder, workers, fill_packages) is not None:
        reason += f"; the folder is empty, so {workers} processes fill it beside the run"
    print(f"verl: bytecode: {reason}", file=sys.stderr, flush=True)
    return BytecodeCache(choice.folder, reason)
