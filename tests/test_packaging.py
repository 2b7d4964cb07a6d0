"""Packaging: the distribution replaces upstream `verl`, ships its configs, and keeps the torch floor low."""
import ast
import os
import re
import shutil
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

import verl

ROOT = Path(__file__).resolve().parents[1]


def _requirements():
    return [Requirement(r) for r in metadata.requires("verl") or []]


def _core(name):
    return next(r for r in _requirements() if r.name == name and not r.marker)


def test_installed_distribution_is_named_verl_with_our_version():
    meta = metadata.metadata("verl")
    assert meta["Name"] == "verl"
    assert meta["Version"] == verl.__version__ == "0.9.1.post1"
    assert meta["Requires-Python"] == ">=3.10"


def test_extras_and_core_dependencies():
    meta = metadata.metadata("verl")
    assert {"vllm", "xformers", "test"} <= set(meta.get_all("Provides-Extra"))
    core = {r.name for r in _requirements() if not r.marker}
    assert {"torch", "transformers", "ray", "hydra-core", "omegaconf", "datasets", "numpy", "pandas",
            "pyarrow"} <= core
    # tensordict is an extra only: the base install must not depend on it (0.15 asks for torch >= 2.11)
    assert "tensordict" not in core


def test_tensordict_extra_is_pinned_to_upstreams_ceiling():
    """verl[tensordict] is 0.10.0 (upstream 0.9.1's ceiling, runs on torch 2.8), read from setup.py so the
    check does not depend on the installed metadata being rebuilt."""
    tree = ast.parse((ROOT / "setup.py").read_text())
    extras = next(ast.literal_eval(n.value) for n in tree.body
                  if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "EXTRAS_REQUIRE")
    for extra in ("tensordict", "test"):
        pins = [Requirement(r) for r in extras[extra] if Requirement(r).name == "tensordict"]
        assert [str(r.specifier) for r in pins] == ["==0.10.0"], extra


def test_torch_and_transformers_floors():
    # 2.8: the oldest torch the suite passes on (scripts/test_floor.sh); 2.7 lacks FSDP2 APIs the workers call
    assert _core("torch").specifier.contains("2.8.0") and not _core("torch").specifier.contains("2.7.1")
    # 4.56: from_pretrained(dtype=...), which model loading uses (4.51 added AttentionInterface)
    assert _core("transformers").specifier.contains("4.56.0")
    assert not _core("transformers").specifier.contains("4.55.4")


def test_wheel_ships_the_hydra_configs(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for name in ("setup.py", "README.md"):
        if (ROOT / name).exists():
            shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "verl", src / "verl", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp_path / "dist"), str(src)], check=True, timeout=300, capture_output=True)
    (wheel,) = (tmp_path / "dist").glob("verl-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert "verl/trainer/config/ppo_trainer.yaml" in names
    assert "verl/trainer/config/upstream_inert.yaml" in names
    assert "verl/trainer/main_ppo.py" in names
    assert not any(n.startswith("tests/") for n in names)


# ------------------------------------------------------------------------------------ the torch floor

# torch APIs newer than the floor, with the release that introduced them. Code under verl/ may use
# them only behind a guard (try/except ImportError or AttributeError, or an `if` that tests for them),
# so the same code still runs on the floor release. Extend this table when adopting a new API.
# This scan is CI's cheap check on names; behaviour on the floor is checked by running the whole
# suite there (scripts/test_floor.sh), which found what no name scan can (FSDP2 on CPU, gloo AVG).
NEWER_TORCH_APIS = {
    "torch.distributed.fsdp.fully_shard": "2.6",
    "torch.distributed.fsdp.FSDPModule": "2.6",
    "torch.distributed.fsdp.MixedPrecisionPolicy": "2.6",
    "torch.distributed.fsdp.CPUOffloadPolicy": "2.6",
    "torch.distributed.fsdp.OffloadPolicy": "2.6",
    "torch.accelerator": "2.6",
    "torch.compiler.set_stance": "2.6",
    "torch.nn.attention.flex_attention": "2.5",
    "torch.distributed.tensor": "2.5",
    "torch.nn.functional.scaled_dot_product_attention(enable_gqa)": "2.5",
}
_GUARD_EXCEPTIONS = {"ImportError", "ModuleNotFoundError", "AttributeError", "Exception"}


def _torch_floor() -> Version:
    match = re.search(r'"torch>=([0-9.]+)"', (ROOT / "setup.py").read_text())
    return Version(match.group(1))


def _dotted(node):
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def _uses(tree):
    """(dotted torch name, line, guarded) for every torch reference in a module."""
    aliases = {}
    out = []

    def guarded_by(stack):
        for parent in stack:
            if isinstance(parent, ast.Try) and any(
                    h.type is None or {_dotted(t) for t in (h.type.elts if isinstance(h.type, ast.Tuple) else [h.type])}
                    & _GUARD_EXCEPTIONS for h in parent.handlers):
                return True
            if isinstance(parent, ast.If) and any(isinstance(n, ast.Name) and n.id in ("hasattr", "getattr")
                                                  or isinstance(n, ast.Attribute) and "version" in n.attr.lower()
                                                  for n in ast.walk(parent.test)):
                return True
        return False

    def visit(node, stack):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("torch"):
                    aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
                    out.append((a.name, node.lineno, guarded_by(stack)))
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("torch"):
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
                out.append((f"{node.module}.{a.name}", node.lineno, guarded_by(stack)))
        elif isinstance(node, ast.Attribute) and not isinstance(stack[-1] if stack else None, ast.Attribute):
            name = _dotted(node)
            if name and name.split(".")[0] in aliases:
                head, _, rest = name.partition(".")
                out.append((aliases[head] + ("." + rest if rest else ""), node.lineno, guarded_by(stack)))
        elif isinstance(node, ast.Call):
            name = _dotted(node.func) or ""
            if name.endswith("scaled_dot_product_attention") and any(k.arg == "enable_gqa" for k in node.keywords):
                out.append(("torch.nn.functional.scaled_dot_product_attention(enable_gqa)", node.lineno,
                            guarded_by(stack)))
        for child in ast.iter_child_nodes(node):
            visit(child, stack + [node])

    visit(tree, [])
    return out


def test_no_unguarded_torch_api_newer_than_the_floor():
    floor = _torch_floor()
    newer = {api: v for api, v in NEWER_TORCH_APIS.items() if Version(v) > floor}
    offenders = []
    for path in sorted((ROOT / "verl").rglob("*.py")):
        for name, line, guarded in _uses(ast.parse(path.read_text(), str(path))):
            for api, version in newer.items():
                if (name == api or name.startswith(api + ".")) and not guarded:
                    offenders.append(f"{path.relative_to(ROOT)}:{line} uses {name} (torch {version}, floor {floor})")
    assert offenders == [], "\n".join(offenders)


def test_floor_scanner_sees_guarded_and_unguarded_uses():
    code = (
        "import torch\n"
        "from torch.distributed.fsdp import fully_shard\n"
        "try:\n    from torch.distributed.fsdp import FSDPModule\nexcept ImportError:\n    FSDPModule = None\n"
        "if hasattr(torch, 'accelerator'):\n    torch.accelerator.current_accelerator()\n"
        "torch.compiler.set_stance('default')\n"
    )
    uses = {(n, g) for n, _, g in _uses(ast.parse(code))}
    assert ("torch.distributed.fsdp.fully_shard", False) in uses
    assert ("torch.distributed.fsdp.FSDPModule", True) in uses
    assert ("torch.accelerator.current_accelerator", True) in uses
    assert ("torch.compiler.set_stance", False) in uses


@pytest.mark.skipif(not Path("/tmp/upstream/verl-0.9.1-py3-none-any.whl").exists(),
                    reason="needs upstream verl 0.9.1's wheel at /tmp/upstream")
@pytest.mark.slow
def test_installing_over_upstream_leaves_ours_importable(tmp_path):
    """pip install of this project over an environment holding upstream verl 0.9.1."""
    # the venv alone decides what `import verl` finds: a PYTHONPATH pointing at a checkout would shadow it
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py = str(venv / "bin" / "python")
    pip = [py, "-m", "pip", "install", "-q", "--no-deps"]
    subprocess.run(pip + ["/tmp/upstream/verl-0.9.1-py3-none-any.whl"], check=True, timeout=300, env=env)
    # upstream's `import verl` needs its dependencies; look at the installed files instead
    probe = ("import importlib.util, importlib.metadata as m, os; d = importlib.util.find_spec('verl')"
             ".submodule_search_locations[0]; print(m.version('verl'), os.path.isdir(os.path.join(d, 'compat')))")
    assert subprocess.run([py, "-c", probe], capture_output=True, text=True, cwd=tmp_path,
                          timeout=120, env=env).stdout.split() == ["0.9.1", "False"]
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(ROOT / "setup.py", src / "setup.py")
    if (ROOT / "README.md").exists():
        shutil.copy(ROOT / "README.md", src / "README.md")
    shutil.copytree(ROOT / "verl", src / "verl", ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(pip + [str(src)], check=True, timeout=300, env=env)
    out = subprocess.run([py, "-c", probe + "; import verl; print(verl.__version__)"], capture_output=True,
                         text=True, cwd=tmp_path, timeout=120, env=env)
    assert out.stdout.split() == ["0.9.1.post1", "True", "0.9.1.post1"], out.stderr
    # nothing of upstream's is left behind to shadow ours
    site = subprocess.run([py, "-c", "import verl, os; print(os.path.dirname(verl.__file__))"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120, env=env).stdout.strip()
    assert not (Path(site) / "trainer" / "main_ppo_v0.py").exists()
