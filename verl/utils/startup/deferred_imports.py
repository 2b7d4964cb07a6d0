"""Import transformers' core without the optional packages it imports only for features verl never runs.

Some transformers releases (5.17, for one) import, at module level, when the package is installed:
- scikit-learn's `roc_curve` in `transformers.generation.candidate_generator`, to tune assisted
  decoding; every model class and `AutoTokenizer` pull that module in;
- scipy's `linear_sum_assignment` in the object-detection losses under `transformers.loss`, which
  `modeling_utils` imports for its loss table.
Both cost every process seconds of start-up (figures: docs/performance.md, "Cold start").

Inside `optional_imports_deferred()` transformers reports those packages as absent. On the way out
its answer is restored in every module that copied it meanwhile, and each listed module that skipped
its import gets a function of that name which imports the real one on its first call. The features
behave as before and pay the import when first used. Newer releases that import these lazily lose
nothing. Keep the block to transformers' core (what `import transformers`, its auto classes and
`modeling_utils` import): a module not listed here that checks the same answer at import (a few
architectures do, for scipy) must be imported after the block.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass


@dataclass(frozen=True)
class Deferral:
    package: str          # the optional package, e.g. "sklearn"
    check: str            # transformers' availability function for it, in transformers.utils
    modules: tuple        # names (or "prefix." for a package's modules) of the modules that import it eagerly
    names: dict           # module-level name they would have imported -> the module it comes from


DEFERRALS = (
    Deferral("sklearn", "is_sklearn_available", ("transformers.generation.candidate_generator",),
             {"roc_curve": "sklearn.metrics"}),
    Deferral("scipy", "is_scipy_available", ("transformers.loss.",),
             {"linear_sum_assignment": "scipy.optimize"}),
)


def on_first_call(module: str, name: str):
    """`module.name`, imported when the returned function is first called."""
    def deferred(*args, **kwargs):
        return getattr(importlib.import_module(module), name)(*args, **kwargs)

    deferred.__name__ = deferred.__qualname__ = name
    deferred.__doc__ = f"`{module}.{name}`, imported on the first call."
    return deferred


def _absent() -> bool:
    return False


def _listed(name: str, modules: tuple) -> bool:
    return any(name.startswith(m) if m.endswith(".") else name == m for m in modules)


@contextmanager
def _deferred(deferral: Deferral):
    """One package deferred, where there is something to defer: installed, not imported yet, and none of
    the modules that import it eagerly imported yet."""
    if (deferral.package in sys.modules or any(_listed(n, deferral.modules) for n in list(sys.modules))
            or importlib.util.find_spec(deferral.package) is None):
        yield
        return
    import transformers.utils as hf_utils

    installed = getattr(hf_utils, deferral.check, None)
    if installed is None:   # a release without this check: nothing it could skip
        yield
        return
    before = set(sys.modules)
    setattr(hf_utils, deferral.check, _absent)
    try:
        yield
    finally:
        setattr(hf_utils, deferral.check, installed)
        for name in set(sys.modules) - before:
            module = sys.modules[name]
            if not name.startswith("transformers") or getattr(module, deferral.check, None) is not _absent:
                continue
            setattr(module, deferral.check, installed)
            if _listed(name, deferral.modules):
                for attribute, source in deferral.names.items():
                    if not hasattr(module, attribute):
                        setattr(module, attribute, on_first_call(source, attribute))


@contextmanager
def optional_imports_deferred(deferrals=DEFERRALS):
    """Run the block (an import of transformers' core) with every deferral above in force."""
    with ExitStack() as stack:
        for deferral in deferrals:
            stack.enter_context(_deferred(deferral))
        yield
