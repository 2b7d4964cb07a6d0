"""The bytecode cache the entry point turns on where the environment switched Python's off
(PYTHONDONTWRITEBYTECODE=1 and packages installed without .pyc, as on the H200 image)."""
import importlib.util
import os
import py_compile
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from verl.utils.startup import SWITCH, bytecode_cache
from verl.utils.startup.bytecode_cache import decide


@pytest.fixture(autouse=True)
def _tricks_on(monkeypatch):
    """These tests check the tricks themselves, so they run with them on whatever the suite's setting."""
    monkeypatch.delenv(SWITCH, raising=False)

FOLDER = "/cache/verl/pycache"


@pytest.mark.parametrize("setting,dont_write,prefix,uncached,folder,says", [
    ("off", True, None, ["torch"], None, "left as they are"),
    (None, True, "/mine", ["torch"], None, "already caches bytecode in /mine"),
    ("/chosen", False, None, [], "/chosen", "VERL_PYCACHE=/chosen"),
    (None, False, None, ["torch"], None, "writes its own"),
    (None, True, None, [], None, "ship their bytecode"),
    (None, True, None, ["torch", "ray"], FOLDER, "torch, ray ship no .pyc"),
])
def test_decision(setting, dont_write, prefix, uncached, folder, says):
    choice = decide(setting, dont_write, prefix, uncached, FOLDER)
    assert choice.folder == folder and says in choice.reason


def _package(root: Path, name: str, compiled: bool) -> None:
    pkg = root / name
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("VALUE = 1\n")
    (pkg / "child.py").write_text("VALUE = 2\n")
    if compiled:
        init = str(pkg / "__init__.py")
        py_compile.compile(init, cfile=importlib.util.cache_from_source(init))


def test_uncached_packages_are_found_without_importing_them(tmp_path, monkeypatch):
    _package(tmp_path, "with_pyc", compiled=True)
    _package(tmp_path, "without_pyc", compiled=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "pycache_prefix", None)
    assert bytecode_cache.uncached_packages(("with_pyc", "without_pyc", "not_installed_anywhere")) == ["without_pyc"]
    assert "without_pyc" not in sys.modules


def test_entry_point_caches_bytecode_for_itself_and_the_processes_it_starts(tmp_path):
    """A fresh interpreter under PYTHONDONTWRITEBYTECODE=1 with a package that ships no .pyc: after
    configure(), its own imports and a child process's land in the cache folder, none beside the sources."""
    src = tmp_path / "src"
    _package(src, "bigpkg", compiled=False)
    cache_home = tmp_path / "cache"
    code = textwrap.dedent("""
        import subprocess, sys
        from verl.utils.startup.bytecode_cache import configure
        choice = configure(packages=("bigpkg",))
        import bigpkg
        subprocess.run([sys.executable, "-c", "import bigpkg.child"], check=True)
        print(choice.folder)
    """)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPYCACHEPREFIX", bytecode_cache.SETTING)}
    env.update(PYTHONDONTWRITEBYTECODE="1", XDG_CACHE_HOME=str(cache_home),
               PYTHONPATH=os.pathsep.join([str(src), env.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    folder = cache_home / "verl" / "pycache"
    assert out.stdout.strip() == str(folder)
    assert "verl: bytecode: PYTHONDONTWRITEBYTECODE is set and bigpkg ship no .pyc" in out.stderr
    cached = {p.name.split(".")[0] for p in folder.rglob("*.pyc") if "bigpkg" in p.parts}
    assert cached == {"__init__", "child"}
    assert not (src / "bigpkg" / "__pycache__").exists()


def test_off_leaves_python_alone(tmp_path):
    src = tmp_path / "src"
    _package(src, "bigpkg", compiled=False)
    code = "from verl.utils.startup.bytecode_cache import configure; import sys; c = configure(packages=('bigpkg',)); " \
           "print(c.folder, sys.pycache_prefix, sys.dont_write_bytecode)"
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", bytecode_cache.SETTING: "off",
           "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")])}
    env.pop("PYTHONPYCACHEPREFIX", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["None", "None", "True"] and "bytecode" not in out.stderr


def test_an_unwritable_folder_is_reported_and_python_left_alone(tmp_path):
    src = tmp_path / "src"
    _package(src, "bigpkg", compiled=False)
    (tmp_path / "not_a_folder").write_text("")
    code = "from verl.utils.startup.bytecode_cache import configure; import sys; c = configure(packages=('bigpkg',)); " \
           "print(c.folder, sys.pycache_prefix)"
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "XDG_CACHE_HOME": str(tmp_path / "not_a_folder"),
           "PYTHONPATH": os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")])}
    for name in ("PYTHONPYCACHEPREFIX", bytecode_cache.SETTING):
        env.pop(name, None)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["None", "None"]
    assert "cannot be written, so every process keeps compiling" in out.stderr and "VERL_PYCACHE" in out.stderr


@pytest.mark.parametrize("cpus,cold,setting,workers", [(16, True, None, 14), (8, True, None, 6), (4, True, None, 0),
                                                       (2, True, None, 0), (16, False, None, 0), (16, True, "off", 0)])
def test_fill_workers(cpus, cold, setting, workers):
    assert bytecode_cache.fill_workers(cpus, cold, setting) == workers


def test_an_empty_folder_is_filled_beside_the_run(tmp_path, monkeypatch):
    """On a many-core host whose cache folder is empty, configure() compiles the fill packages into it in a
    process of its own: every module gets its bytecode where imports will look for it (tests/ skipped),
    and the folder is then no longer empty (a later run starts no fill)."""
    src = tmp_path / "src"
    _package(src, "bigpkg", compiled=False)
    (src / "bigpkg" / "tests").mkdir()
    (src / "bigpkg" / "tests" / "test_it.py").write_text("X = 0\n")
    monkeypatch.syspath_prepend(str(src))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")
    for name in ("PYTHONPYCACHEPREFIX", bytecode_cache.SETTING, bytecode_cache.FILL_SETTING):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(sys, "pycache_prefix", None)
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    monkeypatch.setattr(bytecode_cache, "_ENABLED", None)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    choice = bytecode_cache.configure(packages=("bigpkg",), fill_packages=("bigpkg",))
    folder = str(tmp_path / "cache" / "verl" / "pycache")
    assert choice.folder == folder and "14 processes fill it beside the run" in choice.reason
    assert bytecode_cache._FILL.wait(timeout=60) == 0
    for name in ("__init__.py", "child.py"):
        assert os.path.exists(bytecode_cache._cached_path(str(src / "bigpkg" / name), folder))
    assert not os.path.exists(bytecode_cache._cached_path(str(src / "bigpkg" / "tests" / "test_it.py"), folder))
    assert not bytecode_cache._is_cold(folder, ("bigpkg",))
