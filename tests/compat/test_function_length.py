"""House rule (issue 7): no function in verl/compat/ is over ~60 lines, so each planning rule reads whole."""
import ast
from pathlib import Path

COMPAT = Path(__file__).resolve().parents[2] / "verl" / "compat"
MAX_LINES = 60


def long_functions(root: Path, limit: int) -> list[str]:
    """'path:line name (N lines)' for every function or method under `root` longer than `limit` lines
    (decorators excluded, docstring included)."""
    out = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > limit:
                    out.append(f"{path.relative_to(root.parent.parent)}:{node.lineno} {node.name} ({lines} lines)")
    return out


def test_no_function_in_compat_is_over_60_lines():
    assert long_functions(COMPAT, MAX_LINES) == []


def test_the_check_sees_a_long_function(tmp_path):
    pkg = tmp_path / "verl" / "compat"
    pkg.mkdir(parents=True)
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    (pkg / "long.py").write_text(f"class A:\n    def short(self):\n        return 1\n\n\ndef f():\n{body}\n")
    assert long_functions(pkg, MAX_LINES) == [f"verl/compat/long.py:6 f ({MAX_LINES + 1} lines)"]
