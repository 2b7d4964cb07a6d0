"""transformers' core imported with scikit-learn and scipy deferred: nothing imports them until the function
a module skipped is called, and transformers' own answers about both packages are the installed ones again
afterwards.

Runs in fresh interpreters (what is already imported decides everything here) with stand-in scikit-learn
and scipy packages on the path, the real object-detection loss module (which imports scipy's
`linear_sum_assignment` at module level when transformers says scipy is available), and a stand-in module
shaped like transformers 5.17's candidate generator (which did the same with `sklearn.metrics.roc_curve`).
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from verl.utils.startup import SWITCH

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _tricks_on(monkeypatch):
    """These tests check the tricks themselves, so they run with them on whatever the suite's setting."""
    monkeypatch.delenv(SWITCH, raising=False)


EAGER_MODULE = """
from transformers.utils import is_sklearn_available

if is_sklearn_available():
    from sklearn.metrics import roc_curve
"""


def _run(tmp_path: Path, code: str) -> str:
    (tmp_path / "sklearn").mkdir(exist_ok=True)
    (tmp_path / "sklearn" / "__init__.py").write_text("")
    (tmp_path / "sklearn" / "metrics.py").write_text("def roc_curve(y, s):\n    return ('stand-in', list(y), list(s))\n")
    (tmp_path / "scipy").mkdir(exist_ok=True)
    (tmp_path / "scipy" / "__init__.py").write_text("")
    (tmp_path / "scipy" / "optimize.py").write_text("def linear_sum_assignment(m):\n    return ('stand-in', m)\n")
    # distribution metadata too: transformers 4.x asks importlib.metadata for a version before it says "available"
    for dist, version in (("scikit_learn", "1.5.0"), ("scipy", "1.13.0")):
        info = tmp_path / f"{dist}-{version}.dist-info"
        info.mkdir(exist_ok=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist.replace('_', '-')}\nVersion: {version}\n")
    (tmp_path / "transformers_eager_probe.py").write_text(EAGER_MODULE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_eager_imports_are_skipped_and_transformers_answers_restored(tmp_path):
    out = _run(tmp_path, """
        import sys
        from dataclasses import replace
        from verl.utils.startup.deferred_imports import DEFERRALS, optional_imports_deferred
        import transformers.utils as hf_utils
        sklearn, scipy = DEFERRALS
        probed = (replace(sklearn, modules=(*sklearn.modules, "transformers_eager_probe")), scipy)
        with optional_imports_deferred(probed):
            inside = hf_utils.is_sklearn_available(), hf_utils.is_scipy_available()
            import transformers_eager_probe as eager
            import transformers.loss.loss_for_object_detection as losses
        print("inside", *inside)
        print("imported", "sklearn" in sys.modules, "scipy" in sys.modules)
        print("after", hf_utils.is_sklearn_available(), eager.is_sklearn_available(), hf_utils.is_scipy_available(),
              losses.is_scipy_available())
        print("roc", eager.roc_curve([0, 1], [0.2, 0.8]))
        print("assignment", losses.linear_sum_assignment([[1]]))
        print("imported", "sklearn" in sys.modules, "scipy" in sys.modules)
    """)
    assert out.splitlines() == ["inside False False", "imported False False", "after True True True True",
                                "roc ('stand-in', [0, 1], [0.2, 0.8])", "assignment ('stand-in', [[1]])",
                                "imported True True"]


def test_without_the_deferral_the_modules_import_both(tmp_path):
    """The stand-ins behave like the eager releases: the first test's result is the deferral's doing."""
    out = _run(tmp_path, """
        import sys
        import transformers_eager_probe
        import transformers.loss.loss_for_object_detection
        print("sklearn" in sys.modules, "scipy" in sys.modules)
    """)
    assert out.split() == ["True", "True"]


def test_a_workers_model_code_import_goes_through_the_deferral(tmp_path):
    """import_model_code imports transformers' core (modeling_utils and its losses among it) inside the
    block, the architecture after it; neither package is imported."""
    from transformers import Qwen2Config

    model_dir = tmp_path / "model"
    model_dir.mkdir()
    Qwen2Config(num_hidden_layers=1, hidden_size=16, intermediate_size=32, num_attention_heads=2,
                num_key_value_heads=1, vocab_size=64).save_pretrained(model_dir)
    out = _run(tmp_path, f"""
        import sys
        from verl.utils.startup import transformers_import
        from verl.workers.model_building.loading import import_model_code
        calls = []
        original = transformers_import.optional_imports_deferred
        def counting():
            calls.append(1)
            return original()
        transformers_import.optional_imports_deferred = counting
        import_model_code({str(model_dir)!r})
        names = ("transformers.models.qwen2.modeling_qwen2", "transformers.loss.loss_for_object_detection",
                 "sklearn", "scipy")
        print(len(calls), *(name in sys.modules for name in names))
    """)
    assert out.split() == ["1", "True", "True", "False", "False"]
