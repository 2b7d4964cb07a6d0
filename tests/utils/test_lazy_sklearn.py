"""transformers imported with scikit-learn deferred: nothing imports it until roc_curve is called, and
transformers' own answer about scikit-learn is the installed one again afterwards.

Runs in fresh interpreters (what is already imported decides everything here) with a stand-in scikit-learn
on the path, and a stand-in module shaped like transformers 5.17's candidate generator, which imports
`sklearn.metrics.roc_curve` at module level when transformers says scikit-learn is available.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

EAGER_MODULE = """
from transformers.utils import is_sklearn_available

if is_sklearn_available():
    from sklearn.metrics import roc_curve
"""


def _run(tmp_path: Path, code: str) -> str:
    (tmp_path / "sklearn").mkdir(exist_ok=True)
    (tmp_path / "sklearn" / "__init__.py").write_text("")
    (tmp_path / "sklearn" / "metrics.py").write_text("def roc_curve(y, s):\n    return ('stand-in', list(y), list(s))\n")
    (tmp_path / "transformers_eager_probe.py").write_text(EAGER_MODULE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def test_an_eager_import_is_skipped_and_transformers_answer_restored(tmp_path):
    out = _run(tmp_path, """
        import sys
        from verl.utils.lazy_sklearn import sklearn_deferred
        import transformers.utils as hf_utils
        with sklearn_deferred():
            inside = hf_utils.is_sklearn_available()
            import transformers_eager_probe as probe
            import transformers.generation.candidate_generator as candidates
        print("inside", inside)
        print("imported", "sklearn" in sys.modules)
        print("after", hf_utils.is_sklearn_available(), probe.is_sklearn_available(), candidates.is_sklearn_available())
        print("roc", candidates.roc_curve([0, 1], [0.2, 0.8]))
        print("imported", "sklearn" in sys.modules)
    """)
    assert out.splitlines() == ["inside False", "imported False", "after True True True",
                                "roc ('stand-in', [0, 1], [0.2, 0.8])", "imported True"]


def test_without_the_deferral_the_probe_imports_sklearn(tmp_path):
    """The stand-ins behave like the eager release: the first test's result is the deferral's doing."""
    out = _run(tmp_path, """
        import sys
        import transformers_eager_probe
        print("sklearn" in sys.modules)
    """)
    assert out.split() == ["True"]


def test_a_workers_model_code_import_goes_through_the_deferral(tmp_path):
    """import_model_code (and hf_tokenizer, through the same transformers_import block) defer scikit-learn."""
    from transformers import Qwen2Config

    model_dir = tmp_path / "model"
    model_dir.mkdir()
    Qwen2Config(num_hidden_layers=1, hidden_size=16, intermediate_size=32, num_attention_heads=2,
                num_key_value_heads=1, vocab_size=64).save_pretrained(model_dir)
    out = _run(tmp_path, f"""
        import sys
        from verl.utils import transformers_import
        from verl.utils.model_loading import import_model_code
        calls = []
        original = transformers_import.sklearn_deferred
        def counting():
            calls.append(1)
            return original()
        transformers_import.sklearn_deferred = counting
        import_model_code({str(model_dir)!r})
        print(len(calls), "transformers.models.qwen2.modeling_qwen2" in sys.modules, "sklearn" in sys.modules)
    """)
    assert out.split() == ["1", "True", "False"]
