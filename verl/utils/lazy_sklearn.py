"""Import transformers without importing scikit-learn until something calls it.

Some transformers 5.x releases (5.17, on the H200 image, among them) import `sklearn.metrics.roc_curve`
at module level in `transformers.generation.candidate_generator` when scikit-learn is installed, only to
tune assisted decoding's confidence threshold. Every model class, and there `AutoTokenizer` too, pulls
that module in, so each verl process (the driver for its tokenizer, every worker for its model) paid
scikit-learn's import, 1.3-1.5 s on the H200 host, for a feature no verl code runs. Newer releases
import it lazily, and then this changes nothing.

`sklearn_deferred()` wraps such an import: inside it transformers reports scikit-learn as absent; on
the way out its answer is restored, in every module that copied it meanwhile, and a module-level
`roc_curve` the candidate generator skipped becomes one that imports scikit-learn on its first call.
Assisted decoding behaves as before; it pays the import when it first needs it.
"""
from __future__ import annotations

import importlib.util
import sys
from contextlib import contextmanager

_CANDIDATES = "transformers.generation.candidate_generator"


def roc_curve(*args, **kwargs):
    """scikit-learn's `roc_curve`, imported on the first call."""
    from sklearn.metrics import roc_curve as _roc_curve

    return _roc_curve(*args, **kwargs)


def _absent() -> bool:
    return False


@contextmanager
def sklearn_deferred():
    """Run the block (transformers imports) with scikit-learn's import deferred, where there is one to
    defer: scikit-learn installed, not imported yet, and the candidate generator not imported yet."""
    if _CANDIDATES in sys.modules or "sklearn" in sys.modules or importlib.util.find_spec("sklearn") is None:
        yield
        return
    import transformers.utils as hf_utils

    installed = hf_utils.is_sklearn_available
    before = set(sys.modules)
    hf_utils.is_sklearn_available = _absent
    try:
        yield
    finally:
        hf_utils.is_sklearn_available = installed
        for name in set(sys.modules) - before:
            module = sys.modules[name]
            if name.startswith("transformers") and getattr(module, "is_sklearn_available", None) is _absent:
                module.is_sklearn_available = installed
        candidates = sys.modules.get(_CANDIDATES)
        if candidates is not None and not hasattr(candidates, "roc_curve"):
            candidates.roc_curve = roc_curve
