"""transformers' index of its models folder kept on disk: the same answer as transformers computes, read
back without reading the sources, and computed again when any source below the folder changes."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from verl.utils.startup import SWITCH
from verl.utils.startup import import_structure_cache as cache


@pytest.fixture(autouse=True)
def _tricks_on(monkeypatch):
    """These tests check the tricks themselves, so they run with them on whatever the suite's setting."""
    monkeypatch.delenv(SWITCH, raising=False)

ROOT = Path(__file__).resolve().parents[2]


def _tree(root: Path) -> Path:
    package = root / "models"
    (package / "alpha").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "alpha" / "__init__.py").write_text("")
    (package / "alpha" / "modeling_alpha.py").write_text("__all__ = ['AlphaModel']\n")
    return package


def test_computed_once_then_read_and_computed_again_after_an_edit(tmp_path):
    package = _tree(tmp_path)
    calls = []

    def define(module_path, prefix):
        calls.append((module_path, prefix))
        return {frozenset({"torch"}): {"alpha.modeling_alpha": {"AlphaModel"}}, frozenset(): {}}

    folder = str(tmp_path / "cache")
    first = cache.cached_structure(define, package, "models", "1.0", folder)
    again = cache.cached_structure(define, package, "models", "1.0", folder)
    assert first == again and len(calls) == 1
    assert again == {frozenset({"torch"}): {"alpha.modeling_alpha": {"AlphaModel"}}, frozenset(): {}}
    cache.cached_structure(define, package, "models", "1.1", folder)          # another transformers
    assert len(calls) == 2
    (package / "alpha" / "modeling_alpha.py").write_text("__all__ = ['AlphaModel', 'AlphaForCausalLM']\n")
    cache.cached_structure(define, package, "models", "1.0", folder)          # an edited source
    assert len(calls) == 3
    (package / "beta.py").write_text("")
    cache.cached_structure(define, package, "models", "1.0", folder)          # an added one
    assert len(calls) == 4
    cache.cached_structure(define, str(package / "__init__.py"), None, "1.0", folder)   # another call form
    assert len(calls) == 5


def test_an_unwritable_or_corrupt_cache_still_gives_the_answer(tmp_path):
    package = _tree(tmp_path)
    blocker = tmp_path / "not_a_folder"
    blocker.write_text("")
    answer = {frozenset(): {"alpha.modeling_alpha": {"AlphaModel"}}}
    assert cache.cached_structure(lambda p, x: answer, package, None, "1.0", str(blocker / "sub")) == answer
    folder = tmp_path / "cache"
    cache.cached_structure(lambda p, x: answer, package, None, "1.0", str(folder))
    (entry,) = folder.iterdir()
    entry.write_text("{not json")
    assert cache.cached_structure(lambda p, x: answer, package, None, "1.0", str(folder)) == answer


def test_a_shape_the_encoding_does_not_carry_is_not_kept(tmp_path):
    """A release whose index had another shape (here lists, not sets) is answered as computed, never cached."""
    package = _tree(tmp_path)
    folder = tmp_path / "cache"
    other_shape = {frozenset(): {"alpha.modeling_alpha": ["AlphaModel"]}}
    assert cache.cached_structure(lambda p, x: other_shape, package, None, "1.0", str(folder)) is other_shape
    assert not folder.exists() or not list(folder.iterdir())
    nested = {frozenset(): {"alpha": {"modeling_alpha": {"AlphaModel"}}}}
    assert cache.cached_structure(lambda p, x: nested, package, None, "1.0", str(folder)) is nested
    assert not folder.exists() or not list(folder.iterdir())


def test_the_real_models_folder_reads_back_equal_to_transformers_own(tmp_path):
    import transformers
    from transformers.utils import import_utils

    original = getattr(import_utils.define_import_structure, "__wrapped__", import_utils.define_import_structure)
    models = Path(transformers.__file__).parent / "models"
    computed = cache.cached_structure(original, models, "models", transformers.__version__, str(tmp_path))
    read = cache.cached_structure(lambda *a: None, models, "models", transformers.__version__, str(tmp_path))
    assert read == computed == original(models, "models")
    assert any("models.qwen2.modeling_qwen2" in modules for modules in read.values())


def _opened_model_sources(cache_home: Path) -> tuple[int, str]:
    """A fresh interpreter imports transformers' core as the workers do; how many sources under the
    models folder it opened, and whether the auto classes still resolve Qwen2."""
    code = textwrap.dedent("""
        import sys
        opened = []
        sys.addaudithook(lambda event, args: event == "open" and isinstance(args[0], str)
                         and args[0].endswith(".py") and "/transformers/models/" in args[0] and opened.append(1))
        from verl.utils.startup.transformers_import import transformers_import
        with transformers_import():
            import transformers.modeling_utils
            from transformers import AutoModelForCausalLM, Qwen2Config
        print(len(opened), AutoModelForCausalLM.from_config.__qualname__ and Qwen2Config.model_type)
    """)
    env = {**os.environ, "XDG_CACHE_HOME": str(cache_home),
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    count, model_type = out.stdout.split()
    return int(count), model_type


def test_a_second_process_reads_no_model_sources(tmp_path):
    first, model_type = _opened_model_sources(tmp_path)
    second, _ = _opened_model_sources(tmp_path)
    assert model_type == "qwen2"
    assert first > 1000 and second < 50, (first, second)
    assert len(list((tmp_path / "verl" / "import_structure").glob("*.json"))) == 2


def test_the_finder_is_in_place_only_inside_the_block(monkeypatch):
    """Before transformers' import utilities load, the block puts its finder first (in a new list, so another
    thread walking the old one is undisturbed) and takes it out after; once they are loaded, nothing is added."""
    before = list(sys.meta_path)
    monkeypatch.delitem(sys.modules, cache._IMPORT_UTILS, raising=False)
    with cache.import_structure_cached():
        inside = sys.meta_path
        assert isinstance(inside[0], cache._Finder) and inside[1:] == before and inside is not before
    assert sys.meta_path == before
    monkeypatch.undo()
    from transformers.utils import import_utils   # loaded: wrapped in place instead (undone after the test)

    monkeypatch.setattr(import_utils, "define_import_structure", import_utils.define_import_structure)
    with cache.import_structure_cached():
        assert sys.meta_path == before
    assert getattr(import_utils.define_import_structure, "_verl_cached", False)
