"""HTTP client for a sandbox-fusion code execution server (`POST /run_code`), with retries on 504."""
from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from typing import Any, Optional

from verl.utils.reward_score.prime_code.testing_util import outputs_match

__all__ = ["SUPPORTED_LANGUAGES", "call_sandbox_api", "check_correctness"]

SUPPORTED_LANGUAGES = ["python", "cpp", "nodejs", "go", "go_test", "java", "php", "csharp", "bash", "typescript",
                       "sql", "rust", "cuda", "lua", "R", "perl", "D_ut", "ruby", "scala", "julia", "pytest",
                       "junit", "kotlin_script", "jest", "verilog", "python_gpu", "lean", "swift", "racket"]
MAX_RETRIES = 3
RETRY_DELAY_S = 1.0
API_SLACK_S = 10


def call_sandbox_api(sandbox_fusion_url: str, code: str, stdin: Optional[str], compile_timeout: int,
                     run_timeout: int, memory_limit_mb: int, language: str = "python"
                     ) -> tuple[Optional[dict[str, Any]], Optional[str]]:
    """(response JSON, None) on success, (None, error text) otherwise."""
    if language not in SUPPORTED_LANGUAGES:
        return None, f"Unsupported language: {language}"
    body = json.dumps({"compile_timeout": compile_timeout, "run_timeout": run_timeout, "code": code, "stdin": stdin,
                       "memory_limit_MB": memory_limit_mb, "language": language, "files": {},
                       "fetch_files": []}).encode()
    error = None
    for attempt in range(MAX_RETRIES):
        request = urllib.request.Request(sandbox_fusion_url, data=body, method="POST",
                                         headers={"Content-Type": "application/json", "Accept": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=compile_timeout + run_timeout + API_SLACK_S) as reply:
                return json.loads(reply.read().decode()), None
        except urllib.error.HTTPError as exc:
            error = f"sandbox API error: HTTP {exc.code}"
            if exc.code != 504:
                break
        except (urllib.error.URLError, TimeoutError, ValueError, OSError) as exc:
            error = f"sandbox API error: {exc}"
            break
        time.sleep(RETRY_DELAY_S * (attempt + 1))
    return None, error


def _case_outcome(reply: Optional[dict], error: Optional[str], expected) -> tuple[Any, dict]:
    if reply is None:
        return -1, {"status": "api_error", "api_request_error": error}
    run = reply.get("run_result") or {}
    compile_result = reply.get("compile_result") or {}
    meta = {"status": reply.get("status"), "stdout": run.get("stdout"), "stderr": run.get("stderr"),
            "exit_code": run.get("return_code"), "run_status": run.get("status"),
            "compile_status": compile_result.get("status")}
    if compile_result.get("status") == "TimeLimitExceeded" or run.get("status") == "TimeLimitExceeded":
        meta["status"] = "timeout"
        return -3, meta
    if compile_result.get("status") not in (None, "Finished") or (compile_result.get("return_code") or 0) != 0:
        meta["status"] = "compile_error"
        return -4, meta
    if run.get("status") != "Finished" or run.get("return_code") != 0:
        meta["status"] = "runtime_error"
        return -2, meta
    ok = outputs_match(run.get("stdout") or "", expected)
    meta["status"] = "success" if ok else "wrong_answer"
    return ok, meta


def check_correctness(sandbox_fusion_url: str, in_outs: Optional[dict], generation: str, timeout: int = 10,
                      memory_limit_mb: int = 1024, language: str = "python", concurrent_semaphore=None):
    """Run `generation` on every case through the server: (results, metadata), a result being True, False
    (wrong output) or a negative code (-1 API error, -2 runtime error, -3 timeout, -4 compile error)."""
    if not in_outs or not in_outs.get("inputs"):
        return [-1], [{"status": "no test cases"}]
    results, metadata = [], []
    for stdin, expected in zip(in_outs["inputs"], in_outs["outputs"]):
        if concurrent_semaphore is not None:
            with concurrent_semaphore:
                reply, error = call_sandbox_api(sandbox_fusion_url, generation, str(stdin), timeout, timeout,
                                                memory_limit_mb, language)
        else:
            reply, error = call_sandbox_api(sandbox_fusion_url, generation, str(stdin), timeout, timeout,
                                            memory_limit_mb, language)
        outcome, meta = _case_outcome(reply, error, expected)
        results.append(outcome)
        metadata.append(meta)
    return results, metadata
