"""How much of upstream verl 0.9.1's Python API this verl serves: an import table and the wheel's own CPU tests.

    python tests/upstream/api_report.py [--wheel PATH] [--imports-only] [--tests-only] [--timeout S]

Without --wheel, `pip download verl==0.9.1 --no-deps` fetches the wheel into a temp dir; when the registry cannot
be reached the script prints one line saying so and exits 0. The wheel is only unpacked and read: its modules are
never imported; every import and test runs against the `verl` this script's checkout holds (or the one on
PYTHONPATH).

Part (a) lists the wheel's `verl` modules, sets aside those that need an accelerator stack this verl does not
build on (Megatron, vLLM, SGLang, NPU, ... : found from each file's own imports), and imports each of the others here, in one child process with a per-module alarm.
Part (b) runs the wheel's tests that need no GPU (`*_on_cpu.py`, and the others whose text names no GPU stack),
one pytest process per file with a time limit, `verl` resolving to this checkout.
"""
import argparse
import ast
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
VERSION = "0.9.1"

# top-level packages whose presence in a module marks it as needing a stack this verl does not provide
STACKS = {
    "megatron": "Megatron", "megatron_fsdp": "Megatron", "mbridge": "Megatron", "transformer_engine": "Megatron",
    "vllm": "vLLM", "vllm_ascend": "NPU", "sglang": "SGLang", "sglang_router": "SGLang",
    "torch_npu": "NPU", "mindspeed": "NPU", "msprobe": "NPU", "tensorrt_llm": "TensorRT-LLM",
    "veomni": "VeOmni", "nemo_automodel": "NeMo", "torchtitan": "TorchTitan", "modelopt": "ModelOpt",
    "fsdp_turbo": "fsdp_turbo",
}
# words in a test file that say it needs a GPU (or an accelerator stack) to run
GPU_WORDS = ("cuda", "gpu", "npu", "vllm", "sglang", "megatron")


# ----------------------------------------------------------------------------------------------- the wheel

def fetch_wheel(dest: Path) -> Path | None:
    """Download the 0.9.1 wheel with pip; None when the registry cannot be reached."""
    cmd = [sys.executable, "-m", "pip", "download", f"verl=={VERSION}", "--no-deps", "--only-binary", ":all:",
           "-d", str(dest), "--quiet", "--disable-pip-version-check"]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=180)
    except subprocess.TimeoutExpired:
        return None
    wheels = sorted(dest.glob(f"verl-{VERSION}-*.whl"))
    return wheels[0] if done.returncode == 0 and wheels else None


def unpack(wheel: Path, dest: Path) -> Path:
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(dest)
    if not (dest / "verl").is_dir():
        raise SystemExit(f"{wheel} holds no verl/ package: pass the verl {VERSION} wheel with --wheel")
    return dest


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _external_imports(tree: ast.Module) -> set[str]:
    """Top-level names of every non-relative, non-verl import anywhere in the file (functions and try blocks too)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names - {"verl"}


def classify(root: Path) -> dict[str, str | None]:
    """Module -> the stack it imports (None: plain Python, torch, Ray, ... which this verl should serve).

    Counted from the module's own imports, wherever they sit: a module that only reaches such a stack through
    another verl module stays in the importable set (its import here says whether that holds)."""
    needs = {}
    for path in sorted((root / "verl").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        found = sorted(e for e in _external_imports(tree) if e in STACKS)
        needs[module_name(root, path)] = STACKS[found[0]] if found else None
    return needs


# ----------------------------------------------------------------------------------------------- imports here

_IMPORT_CHILD = r"""
import importlib, json, signal, sys, traceback
names = json.loads(sys.stdin.read()); limit = int(sys.argv[1])
def alarm(*_): raise TimeoutError(f"import took over {limit} s")
signal.signal(signal.SIGALRM, alarm)
for name in names:
    signal.alarm(limit)
    try:
        module = importlib.import_module(name)
        result = "stand-in" if getattr(module, "__verl_unsupported__", None) else "ok"
    except BaseException as exc:
        result = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:160]
    finally:
        signal.alarm(0)
    print(json.dumps([name, result]), flush=True)
"""


def import_here(names: list[str], per_module_s: int) -> dict[str, str]:
    """Import each module in one child process (this checkout first on its path); name -> 'ok', 'stand-in' (a
    module for a feature this verl does not have: it imports, its names raise NotImplementedError) or the
    error."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in [str(REPO_ROOT), os.environ.get("PYTHONPATH")] if p))
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    results: dict[str, str] = {}
    pending = list(names)
    while pending:  # a child that dies (a crash in native code) is restarted after the module that killed it
        proc = subprocess.run([sys.executable, "-c", _IMPORT_CHILD, str(per_module_s)], input=json.dumps(pending),
                              capture_output=True, text=True, env=env, cwd=tempfile.gettempdir(),
                              timeout=per_module_s * len(pending) + 60)
        for line in proc.stdout.splitlines():
            try:
                name, result = json.loads(line)
            except (ValueError, TypeError):
                continue
            results[name] = result
        pending = [n for n in pending if n not in results]
        if pending:
            results[pending[0]] = f"import process died (exit {proc.returncode})"
            pending = pending[1:]
    return results


# ----------------------------------------------------------------------------------------------- wheel tests

def cpu_test_files(root: Path) -> list[Path]:
    tests = root / "tests"
    files = []
    for path in sorted(tests.rglob("test_*.py")):
        text = path.read_text(encoding="utf-8").lower()
        if path.stem.endswith("_on_cpu") or "cpu" in path.stem or not any(w in text for w in GPU_WORDS):
            files.append(path)
    return files


def run_test_file(root: Path, path: Path, timeout_s: int) -> tuple[str, str]:
    """('pass' | 'fail' | 'timeout', summary line) for one wheel test file run under pytest against this verl."""
    # cwd is the unpacked wheel with its verl/ a link to this checkout's: `tests` is the wheel's, `verl` ours
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in [str(root), str(REPO_ROOT)] if p),
               RAY_USAGE_STATS_ENABLED="0", OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "--rootdir", str(root),
           "-o", "addopts=", str(path.relative_to(root))]
    try:
        proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return "timeout", f"over {timeout_s} s"
    lines = [ln for ln in proc.stdout.splitlines() if ln.strip()]
    summary = lines[-1].strip("= ") if lines else proc.stderr.strip().splitlines()[-1:] or ""
    if isinstance(summary, list):
        summary = summary[0] if summary else ""
    # exit 5: nothing collected (every test skipped at import) counts as not passing
    return ("pass" if proc.returncode == 0 else "fail"), summary[:150]


# ----------------------------------------------------------------------------------------------- report

def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wheel", type=Path, help=f"the verl {VERSION} wheel (default: pip download it)")
    parser.add_argument("--imports-only", action="store_true")
    parser.add_argument("--tests-only", action="store_true")
    parser.add_argument("--timeout", type=int, default=120, help="seconds per wheel test file (default 120)")
    parser.add_argument("--import-timeout", type=int, default=60, help="seconds per module import (default 60)")
    parser.add_argument("--failures", action="store_true", help="print the error of each module that fails")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="verl-upstream-") as tmp:
        tmp = Path(tmp)
        wheel = args.wheel
        if wheel is None:
            wheel = fetch_wheel(tmp / "dl")
            if wheel is None:
                print(f"skipped: pip could not download verl=={VERSION} (registry unreachable?); pass --wheel PATH")
                return 0
        if not wheel.is_file():
            raise SystemExit(f"--wheel {wheel}: no such file")
        root = unpack(wheel, tmp / "wheel")

        if not args.tests_only:
            needs = classify(root)
            stack = {n: s for n, s in needs.items() if s}
            plain = sorted(n for n, s in needs.items() if not s)
            results = import_here(plain, args.import_timeout)
            ok = sorted(n for n in plain if results[n] == "ok")
            shells = sorted(n for n in plain if results[n] == "stand-in")
            print(f"## Modules of verl {VERSION}: {len(needs)}; need another stack: {len(stack)}; "
                  f"the other {len(plain)} import here: {len(ok) + len(shells)} ({len(ok)} working, "
                  f"{len(shells)} stand-ins for unsupported features)\n")
            print("| module | here |\n|---|---|")
            for name in plain:
                verdict = results[name] if results[name] in ("ok", "stand-in") or args.failures else "fails"
                print(f"| `{name}` | {verdict} |")
            print("\n| stack | modules set aside |\n|---|---|")
            counts: dict[str, int] = {}
            for s in stack.values():
                counts[s] = counts.get(s, 0) + 1
            for key, count in sorted(counts.items(), key=lambda kv: -kv[1]):
                print(f"| {key} | {count} |")
            print(f"\nimports: {len(ok) + len(shells)} of {len(plain)} ({len(ok)} working, {len(shells)} stand-ins)\n")

        if not args.imports_only:
            if not (root / "tests").is_dir():
                print(f"the {wheel.name} wheel holds no tests/: no wheel tests to run")
                return 0
            # `verl` in the wheel's root becomes a link to this checkout's package: imports resolve here, and
            # the tests that read files beside their repository root (YAML groups, sources) read this verl's
            shutil.move(str(root / "verl"), str(tmp / "wheel-verl"))
            (root / "verl").symlink_to(REPO_ROOT / "verl", target_is_directory=True)
            files = cpu_test_files(root)
            print(f"## The wheel's CPU test files ({len(files)}), run against this verl\n")
            print("| file | result | pytest's last line |\n|---|---|---|")
            passed = 0
            for path in files:
                verdict, summary = run_test_file(root, path, args.timeout)
                passed += verdict == "pass"
                print(f"| `{path.relative_to(root)}` | {verdict} | {summary.replace('|', '/')} |", flush=True)
            print(f"\nwheel tests: {passed} of {len(files)} files pass")
    return 0


if __name__ == "__main__":
    sys.exit(main())
