"""The layers import downwards only, read statically from every import statement in `verl/`.

`verl.compat` (hardware decisions) sits below the workers and the trainer that receive its plan, and
inside it `device` (what the machine is) sits below `planning` (what to do on it), which sits below `apply`
(putting the plan in force);
`verl.utils` (shared helpers) sits below the workers and the trainer and never reaches into the planner
(the workers' own model building lives in `verl.workers.model_building`). An import
placed inside a function counts as much as one at the top of a file.
"""
import ast
import sys
from pathlib import Path

import pytest

VERL = Path(__file__).resolve().parents[1] / "verl"

# (package scanned, module prefixes it must not import)
RULES = [
    ("verl.compat", ("verl.workers", "verl.trainer")),
    # compat's own flow: the device is read, a plan made from it, the plan applied
    ("verl.compat.device", ("verl.compat.planning", "verl.compat.apply")),
    ("verl.compat.planning", ("verl.compat.apply",)),
    ("verl.utils", ("verl.trainer", "verl.workers", "verl.compat.planning.planner")),
]
# The doctor (`python -m verl.compat`) is an entry point like `main_ppo`: it composes the config the way
# main_ppo does, so it may import the trainer's config loader. Nothing in the library imports it.
ENTRY_POINTS = {"verl.compat.__main__": ("verl.trainer.config_check",)}


def module_name(path: Path) -> str:
    parts = path.relative_to(VERL.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in the file; relative imports resolved."""
    own = module_name(path)
    package = own if path.name == "__init__.py" else own.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # `from verl.compat.planning import planner` names a module too
            found += [(node.lineno, base)] + [(node.lineno, f"{base}.{a.name}") for a in node.names]
    return found


def violations(package: str, forbidden: tuple[str, ...]) -> list[str]:
    root = VERL.parent.joinpath(*package.split("."))
    bad = []
    for path in sorted(root.rglob("*.py")):
        mod = module_name(path)
        allowed = ENTRY_POINTS.get(mod, ())
        for line, name in imported_modules(path):
            hit = next((f for f in forbidden if name == f or name.startswith(f + ".")), None)
            if hit and not any(name == a or name.startswith(a + ".") for a in allowed):
                bad.append(f"{path.relative_to(VERL.parent)}:{line} imports {name}")
    return sorted(set(bad))


@pytest.mark.parametrize("package,forbidden", RULES, ids=[r[0] for r in RULES])
def test_lower_layers_do_not_import_upper_ones(package, forbidden):
    bad = violations(package, forbidden)
    assert not bad, (f"{package} must not import {', '.join(forbidden)}; move the shared piece down into "
                     f"{package} (or verl.utils):\n" + "\n".join(bad))


def test_the_scan_sees_relative_and_nested_imports(tmp_path, monkeypatch):
    """A relative import inside a function is resolved and caught: the rule cannot pass by missing it."""
    pkg = tmp_path / "verl" / "utils" / "sub"
    pkg.mkdir(parents=True)
    (tmp_path / "verl" / "trainer").mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "mod.py").write_text("def f():\n    from ...trainer.ppo import reward\n    from verl.compat.planning import planner\n"
                                "    from ...workers.model_building import loading\n")
    monkeypatch.setattr(sys.modules[__name__], "VERL", tmp_path / "verl")
    assert violations("verl.utils", dict(RULES)["verl.utils"]) == [
        "verl/utils/sub/mod.py:2 imports verl.trainer.ppo",
        "verl/utils/sub/mod.py:2 imports verl.trainer.ppo.reward",
        "verl/utils/sub/mod.py:3 imports verl.compat.planning.planner",
        "verl/utils/sub/mod.py:4 imports verl.workers.model_building",
        "verl/utils/sub/mod.py:4 imports verl.workers.model_building.loading",
    ]
