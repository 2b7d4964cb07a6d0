"""transformers' index of its model folders, kept on disk between runs.

`import transformers` and `import transformers.models` each build an "import structure" for the
`models` package (which class lives in which module, behind which backends) by reading every
module's source under it (about 1,500 files), paid by the driver (its tokenizer) and by every worker
(its model) on every run.

Inside `import_structure_cached()`, when transformers' import utilities load, their
`define_import_structure` is wrapped: for the `models` folder the answer is read from a JSON file
named by transformers' version, the folder, the prefix and the path, size and mtime of every `.py`
file below it (a stat per file), and written there when missing. Any edited, added or removed
source gives another name, so a stale index is never read; every other folder goes to transformers.
The file is plain JSON (no pickle): a cache folder that others can write to cannot run code here.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.machinery
import json
import logging
import os
import sys
import tempfile
from contextlib import contextmanager
from pathlib import Path

from verl.utils.startup.bytecode_cache import cache_dir

logger = logging.getLogger(__name__)

_IMPORT_UTILS = "transformers.utils.import_utils"


def cache_folder() -> str:
    return cache_dir("import_structure")


def source_stamp(folder: str) -> str:
    """A digest of every .py file's relative path, size and mtime under `folder`."""
    digest = hashlib.sha1()
    pending = [folder]
    while pending:
        current = pending.pop()
        with os.scandir(current) as entries:
            for entry in sorted(entries, key=lambda e: e.name):
                if entry.is_dir(follow_symlinks=False):
                    if entry.name != "__pycache__":
                        pending.append(entry.path)
                elif entry.name.endswith(".py"):
                    stat = entry.stat()
                    relative = os.path.relpath(entry.path, folder)
                    digest.update(f"{relative}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return digest.hexdigest()


def _encode(structure: dict) -> list:
    return [[sorted(backends), {module: sorted(names) for module, names in modules.items()}]
            for backends, modules in structure.items()]


def _decode(rows: list) -> dict:
    return {frozenset(backends): {module: set(names) for module, names in modules.items()}
            for backends, modules in rows}


def cached_structure(define, module_path, prefix, version: str, folder: str) -> dict:
    """`define(module_path, prefix)`, read from (or written to) `folder` under a name that changes with
    transformers' version and with any source file below the package."""
    package = Path(module_path)
    package = package.parent if package.suffix == ".py" else package
    key = f"{version}\0{package.resolve()}\0{module_path}\0{prefix}\0{source_stamp(str(package))}"
    path = os.path.join(folder, hashlib.sha1(key.encode()).hexdigest() + ".json")
    try:
        with open(path) as f:
            return _decode(json.load(f))
    except (OSError, ValueError, TypeError):
        pass
    structure = define(module_path, prefix)
    try:
        rows = _encode(structure)
        if _decode(rows) != structure:   # a shape this encoding does not carry: keep nothing
            return structure
        os.makedirs(folder, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=folder, suffix=".tmp", delete=False) as f:
            json.dump(rows, f)
        os.replace(f.name, path)
    except (OSError, TypeError, ValueError, AttributeError):
        logger.debug("could not keep transformers' import structure in %s", folder, exc_info=True)
    return structure


def _wrap(import_utils) -> None:
    """Replace `define_import_structure` in transformers' import utilities (once) by the cached one for
    the `models` folder."""
    original = import_utils.define_import_structure
    if getattr(original, "_verl_cached", False):
        return
    transformers = sys.modules["transformers"]   # mid-import when called from the loader: enough for these two
    models = Path(transformers.__file__).resolve().parent / "models"
    version = getattr(transformers, "__version__", "unknown")

    @functools.lru_cache
    def define_import_structure(module_path, prefix=None):
        package = Path(module_path)
        package = package.parent if package.suffix == ".py" else package
        if package.resolve() != models:
            return original(module_path, prefix)
        return cached_structure(original, module_path, prefix, version, cache_folder())

    define_import_structure._verl_cached = True
    define_import_structure.__wrapped__ = original
    import_utils.define_import_structure = define_import_structure


class _WrapAfterExec:
    """The path finder's loader for transformers' import utilities, which wraps the module once it ran."""

    def __init__(self, loader):
        self._loader = loader

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        module.__spec__.loader = module.__loader__ = self._loader
        self._loader.exec_module(module)
        _wrap(module)


class _Finder:
    """Finds transformers' import utilities as the path finder does, with the loader above."""

    def find_spec(self, name, path=None, target=None):
        if name != _IMPORT_UTILS:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path, target)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _WrapAfterExec(spec.loader)
        return spec


@contextmanager
def import_structure_cached():
    """Run the block (which imports transformers) with the models folder's import structure cached."""
    loaded = sys.modules.get(_IMPORT_UTILS)
    if loaded is not None:   # transformers is imported: its `models` package may still be to come
        _wrap(loaded)
        yield
        return
    # New lists rather than insert/remove: another thread (Ray's start, on the driver) may be walking the
    # finders of the current list for an import of its own, and shifting it could make that walk skip one.
    finder = _Finder()
    sys.meta_path = [finder, *sys.meta_path]
    try:
        yield
    finally:
        sys.meta_path = [f for f in sys.meta_path if f is not finder]
