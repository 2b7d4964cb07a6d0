"""Runs a candidate Python program against stdin/stdout test cases, each in its own child process with a wall
clock limit, a CPU-time limit and an address-space limit (`resource` limits, POSIX), in an empty temp directory
with a scrubbed environment. This bounds runaway code; it is not a security boundary against hostile code (use a
sandbox_fusion server for that)."""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile

__all__ = ["run_case", "run_test", "outputs_match"]


def _limits(memory_mb: int, cpu_s: int):
    def apply():
        import resource

        limit = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        os.setsid()

    return apply


def run_case(code: str, stdin: str, timeout: float = 10, memory_mb: int = 1024) -> dict:
    """Run `code` with `stdin`; {"status": "ok"|"timeout"|"error", "stdout", "stderr", "returncode"}."""
    with tempfile.TemporaryDirectory(prefix="verl-code-") as workdir:
        path = os.path.join(workdir, "solution.py")
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(code)
        env = {"PATH": "/usr/bin:/bin", "PYTHONHASHSEED": "0", "OMP_NUM_THREADS": "1"}
        try:
            proc = subprocess.run([sys.executable, "-I", "-S", path], input=stdin, capture_output=True, text=True,
                                  cwd=workdir, env=env, timeout=timeout,
                                  preexec_fn=_limits(memory_mb, max(1, int(timeout) + 1)))
        except subprocess.TimeoutExpired as exc:
            return {"status": "timeout", "stdout": exc.stdout or "", "stderr": "", "returncode": None}
    status = "ok" if proc.returncode == 0 else "error"
    return {"status": status, "stdout": proc.stdout, "stderr": proc.stderr[-2000:], "returncode": proc.returncode}


def outputs_match(got: str, expected) -> bool:
    """Compare printed output with the expected one line by line, ignoring surrounding whitespace; numbers that
    parse as floats match within 1e-6."""
    if isinstance(expected, list):
        expected = "\n".join(map(str, expected))
    got_lines = [ln.strip() for ln in str(got).strip().splitlines()]
    want_lines = [ln.strip() for ln in str(expected).strip().splitlines()]
    if got_lines == want_lines:
        return True
    if len(got_lines) != len(want_lines):
        return False
    for a, b in zip(got_lines, want_lines):
        ta, tb = a.split(), b.split()
        if len(ta) != len(tb):
            return False
        for x, y in zip(ta, tb):
            if x == y:
                continue
            try:
                if abs(float(x) - float(y)) > 1e-6:
                    return False
            except ValueError:
                return False
    return True


def _as_stdin(value) -> str:
    if isinstance(value, list):
        value = "\n".join(map(str, value))
    value = str(value)
    return value if value.endswith("\n") else value + "\n"


def run_test(in_outs: dict, code: str, timeout: float = 10, memory_mb: int = 1024, stop_at_first_failure: bool = True):
    """Per test case: True (output matches), False (wrong output), -1 (crashed) or -2 (ran past `timeout` or its
    CPU limit); and one metadata dict per case run."""
    if in_outs.get("fn_name"):
        raise NotImplementedError("prime_code: call-based test cases (fn_name) are not supported here; give "
                                  "stdin/stdout test cases")
    results, metadata = [], []
    for stdin, expected in zip(in_outs["inputs"], in_outs["outputs"]):
        run = run_case(code, _as_stdin(stdin), timeout=timeout, memory_mb=memory_mb)
        if run["status"] == "timeout" or (run["returncode"] is not None and run["returncode"] < 0):
            outcome = -2  # killed by the wall clock or by SIGXCPU / SIGKILL
        elif run["status"] == "error":
            outcome = -1
        else:
            outcome = outputs_match(run["stdout"], expected)
        results.append(outcome)
        metadata.append({"status": run["status"], "returncode": run["returncode"], "stderr": run["stderr"][-500:],
                         "output": run["stdout"][-500:], "expected": str(expected)[-500:]})
        if stop_at_first_failure and outcome is not True:
            break
    return results, metadata
