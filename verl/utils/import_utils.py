"""Loading an object from a user's Python file named in the config (reward function, dataset, sampler)."""

from __future__ import annotations

import importlib.util
import os
import sys
import traceback


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
