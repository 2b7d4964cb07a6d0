"""Optional-package checks and loaders for user code named in the config (reward function, dataset, sampler)."""
from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import sys
import traceback
import warnings
from typing import Optional

__all__ = ["is_megatron_core_available", "is_vllm_available", "is_sglang_available", "is_nvtx_available",
           "is_trl_available", "is_msprobe_available", "import_external_libs", "resolve_config_path",
           "PKG_PATH_PREFIX", "FILE_PATH_PREFIX", "load_module", "deprecated", "load_extern_object",
           "load_class_from_fqn", "load_extern_type", "load_object_from_file"]

PKG_PATH_PREFIX = "pkg://"
FILE_PATH_PREFIX = "file://"


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


# upstream's availability checks, one per optional package
is_megatron_core_available = functools.partial(_installed, "megatron.core")
is_vllm_available = functools.partial(_installed, "vllm")
is_sglang_available = functools.partial(_installed, "sglang")
is_nvtx_available = functools.partial(_installed, "nvtx")
is_trl_available = functools.partial(_installed, "trl")
is_msprobe_available = functools.partial(_installed, "msprobe")


def import_external_libs(external_libs=None) -> None:
    """Import a module name, or each of a list of them (registers user models and hooks)."""
    if external_libs is None:
        return
    for name in external_libs if isinstance(external_libs, (list, tuple)) else [external_libs]:
        importlib.import_module(name)


def resolve_config_path(config_path: str) -> str:
    """An absolute path for `config_path`: as given when absolute, else under the working directory, the
    checkout that holds `verl`, or the `verl` package, the first that exists."""
    if os.path.isabs(config_path):
        return config_path
    import verl

    package = os.path.dirname(os.path.abspath(verl.__file__))
    for base in (os.getcwd(), os.path.dirname(package), package):
        base = os.path.abspath(base)
        candidate = os.path.abspath(os.path.join(base, config_path))
        if candidate.startswith(base + os.sep) and os.path.exists(candidate):
            return candidate
    raise FileNotFoundError(f"config file {config_path!r} not found under the working directory or the verl "
                            "checkout; give an absolute path")


def load_module(module_path: str, module_name: Optional[str] = None):
    """A module from `pkg://dotted.name` (or `pkg://dotted/name`), `file://path.py` or a plain file path.
    A file module is registered in sys.modules only when `module_name` is given."""
    if not module_path:
        return None
    if module_path.startswith(PKG_PATH_PREFIX):
        return importlib.import_module(module_path[len(PKG_PATH_PREFIX):].replace("/", "."))
    if module_path.startswith(FILE_PATH_PREFIX):
        module_path = module_path[len(FILE_PATH_PREFIX):]
    if not os.path.exists(module_path):
        raise FileNotFoundError(f"Custom module file not found: {module_path=}")
    name = module_name or f"custom_module_{abs(hash(os.path.abspath(module_path)))}"
    spec = importlib.util.spec_from_file_location(name, module_path)
    if spec is None or spec.loader is None:
        raise ImportError(f"Could not load module from {module_path=}")
    module = importlib.util.module_from_spec(spec)
    if module_name:
        sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        if module_name:
            sys.modules.pop(module_name, None)
        raise RuntimeError(f"Error loading module from {module_path=}: {exc}") from exc
    return module


def deprecated(replacement: str = ""):
    """Decorator: calling the function (or constructing the class) warns with a DeprecationWarning."""

    def decorate(obj):
        text = f"{obj.__qualname__} is deprecated" + (f"; use {replacement} instead" if replacement else "")
        if isinstance(obj, type):
            original = obj.__init__

            @functools.wraps(original)
            def init(self, *args, **kwargs):
                warnings.warn(text, DeprecationWarning, stacklevel=2)
                original(self, *args, **kwargs)

            obj.__init__ = init
            return obj

        @functools.wraps(obj)
        def call(*args, **kwargs):
            warnings.warn(text, DeprecationWarning, stacklevel=2)
            return obj(*args, **kwargs)

        return call

    return decorate


def load_extern_object(module_path: str, object_name: str):
    """`getattr(load_module(module_path), object_name)`, with an error naming both when it is missing."""
    module = load_module(module_path)
    if not hasattr(module, object_name):
        raise AttributeError(f"Object not found in module: {object_name=}, {module_path=}.")
    return getattr(module, object_name)


def load_class_from_fqn(fqn: str, description: str = "class") -> type:
    """The class `package.module.Name` names."""
    if "." not in fqn:
        raise ValueError(f"Invalid {description} '{fqn}': expected a fully qualified name like 'package.module.Class'")
    module_name, name = fqn.rsplit(".", 1)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ImportError(f"Failed to import module '{module_name}' for {description}: {exc}") from exc
    if not hasattr(module, name):
        raise AttributeError(f"Class '{name}' not found in module '{module_name}'")
    return getattr(module, name)


@deprecated(replacement="load_extern_object(file_path, type_name)")
def load_extern_type(file_path: str, type_name: str) -> type:
    """Deprecated alias of `load_extern_object`."""
    return load_extern_object(file_path, type_name)

def load_object_from_file(path: str, name: str, setting: str):
    """Import the Python file at `path` and return its attribute `name`.

    `setting` is the config key the user set (e.g. "custom_reward_function"), named in every error so the
    user knows what to fix.
    """
    full_path = os.path.abspath(os.path.expanduser(path))
    if not os.path.isfile(full_path):
        raise FileNotFoundError(f"{setting}.path={path!r}: no such file (looked at {full_path})")

    module_name = f"verl_user_code_{os.path.splitext(os.path.basename(full_path))[0]}"
    spec = importlib.util.spec_from_file_location(module_name, full_path)
    module = importlib.util.module_from_spec(spec)
    # Listed in sys.modules only while it runs (dataclasses look their module up there). Unlisted afterwards,
    # its functions are pickled by value, so Ray can ship them to processes that cannot import the file.
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as err:
        frames = [f for f in traceback.extract_tb(err.__traceback__) if f.filename == full_path]
        where = "".join(traceback.format_list(frames)) or "  (raised while importing the file)\n"
        raise RuntimeError(
            f"{setting}.path={path!r}: importing the file failed with {type(err).__name__}: {err}\n{where}"
            "Fix the file, or check that the packages it imports are installed."
        ) from err
    finally:
        sys.modules.pop(module_name, None)

    if not hasattr(module, name):
        defined = sorted(
            attr
            for attr, value in vars(module).items()
            if callable(value) and not attr.startswith("_") and getattr(value, "__module__", None) == module_name
        )
        listing = f"it defines: {', '.join(defined)}" if defined else "it defines no public functions"
        raise AttributeError(
            f"{setting}.name={name!r} not found in {full_path}; {listing}. Set {setting}.name to one of them."
        )
    return getattr(module, name)
