"""Upstream's prime_math, prime_code, sandbox_fusion, math_batch and math_verify scorers on real examples:
correct, wrong and malformed answers; programs that loop forever or allocate too much are stopped."""
import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from verl.utils.reward_score import default_compute_score, get_default_compute_score

ADD_TWO = {"inputs": ["1 2\n", "10 -3\n", "0 0\n"], "outputs": ["3\n", "7\n", "0\n"]}
RIGHT = "Here is my solution.\n```python\na, b = map(int, input().split())\nprint(a + b)\n```"
WRONG = "```python\na, b = map(int, input().split())\nprint(a - b)\n```"


# ------------------------------------------------------------------------------------------ prime_math

@pytest.mark.parametrize("output, truth, correct", [
    ("Step 1: ... Step 2: so the answer is \\boxed{\\frac{1}{2}}", "0.5", True),
    ("The answer is \\boxed{2\\sqrt{2}}", "\\sqrt{8}", True),           # needs the symbolic check
    ("Thus x = \\boxed{(1, 2)}", "(1,2)", True),
    ("The answer is \\boxed{50\\%}", "0.5", True),
    ("The answer is \\boxed{7}", "8", False),
    ("The answer is \\boxed{x^2+1}", "x^2-1", False),
    ("I could not solve it", "3", False),                                     # no answer at all
    ("The answer is \\boxed{\\frac{1}{", "0.5", False),                     # unclosed brace
])
def test_prime_math_grades_answers(output, truth, correct):
    from verl.utils.reward_score import prime_math

    got, formatted, extracted = prime_math.compute_score(output, truth)
    assert got is correct, (output, extracted)
    assert formatted == ("Step 2:" in output and "\\box" in output)
    assert default_compute_score("numina_olympiads", output, truth) == float(correct)


def test_prime_math_match_answer_reads_the_answer_phrase():
    from verl.utils.reward_score.prime_math import match_answer

    assert match_answer("so the final answer is 42. Done") == (True, "42")
    assert match_answer("The answer: \\boxed{3.5}") == (True, "3.5")
    assert match_answer("nothing here")[0] is False


# ------------------------------------------------------------------------------------------ prime_code

def test_prime_code_scores_right_wrong_and_malformed_programs():
    from verl.utils.reward_score import prime_code

    assert prime_code.compute_score(RIGHT, ADD_TWO)[0] is True
    assert prime_code.compute_score(RIGHT, json.dumps(ADD_TWO))[0] is True          # upstream passes JSON text
    assert prime_code.compute_score(WRONG, ADD_TWO)[0] is False
    ok, meta = prime_code.compute_score("```python\nprint(1 +\n```", ADD_TWO)      # syntax error
    assert ok is False and meta[0]["status"] == "error" and "SyntaxError" in meta[0]["stderr"]
    assert prime_code.compute_score(RIGHT, "not json")[0] is False
    # continuous: fraction of cases passed
    half = "```python\na, b = map(int, input().split())\nprint(a + b if a else 99)\n```"
    assert prime_code.compute_score(half, ADD_TWO, continuous=True)[0] == pytest.approx(2 / 3)
    assert default_compute_score("codecontests", RIGHT, json.dumps(ADD_TWO)) == 1.0


def test_prime_code_stops_a_program_that_loops_forever():
    from verl.utils.reward_score.prime_code.testing_util import run_test

    results, meta = run_test({"inputs": ["1\n"], "outputs": ["1\n"]}, "while True:\n    pass\n", timeout=1)
    assert results == [-2] and meta[0]["status"] in ("timeout", "error")


def test_prime_code_stops_a_program_that_allocates_too_much():
    from verl.utils.reward_score.prime_code.testing_util import run_test

    hog = "x = bytearray(2 * 1024 ** 3)\nprint(len(x))\n"   # 2 GiB against a 256 MiB limit
    results, meta = run_test({"inputs": [""], "outputs": [str(2 * 1024 ** 3)]}, hog, timeout=5, memory_mb=256)
    assert results == [-1] and "MemoryError" in meta[0]["stderr"]


# ------------------------------------------------------------------------------------------ sandbox_fusion

class _FakeSandbox(BaseHTTPRequestHandler):
    """Answers /run_code like sandbox-fusion: runs python locally with prime_code's runner."""

    requests = []

    def do_POST(self):
        from verl.utils.reward_score.prime_code.testing_util import run_case

        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append(body)
        run = run_case(body["code"], body["stdin"] or "", timeout=body["run_timeout"],
                       memory_mb=body["memory_limit_MB"])
        status = {"ok": "Finished", "error": "Finished", "timeout": "TimeLimitExceeded"}[run["status"]]
        reply = {"status": "Success" if run["status"] == "ok" else "Failed", "compile_result": None,
                 "run_result": {"status": status, "stdout": run["stdout"], "stderr": run["stderr"],
                                "return_code": run["returncode"]}}
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def sandbox_url():
    server = HTTPServer(("127.0.0.1", 0), _FakeSandbox)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/run_code"
    server.shutdown()
    server.server_close()


def test_sandbox_fusion_client_against_a_local_server(sandbox_url):
    from verl.utils.reward_score import sandbox_fusion

    _FakeSandbox.requests.clear()
    score, meta = sandbox_fusion.compute_score(sandbox_url, None, 512, RIGHT, json.dumps(ADD_TWO))
    assert score == 1.0 and [m["status"] for m in meta] == ["success"] * 3
    sent = _FakeSandbox.requests[0]
    assert sent["language"] == "python" and sent["memory_limit_MB"] == 512 and sent["stdin"] == "1 2\n"
    assert sent["code"].strip().startswith("a, b = map(int")        # the fenced block, not the prose
    assert sandbox_fusion.compute_score(sandbox_url, None, 512, WRONG, ADD_TWO)[0] == pytest.approx(1 / 3)  # 0 0
    score, meta = sandbox_fusion.compute_score(sandbox_url, threading.Semaphore(2), 512,
                                               "```python\nwhile True: pass\n```", {"inputs": ["1"], "outputs": ["1"]},
                                               timeout=1)
    assert score == 0.0 and meta[0]["status"] == "timeout"
    assert default_compute_score("apps", RIGHT, json.dumps(ADD_TWO), sandbox_fusion_url=sandbox_url) == 1.0
    assert sandbox_fusion.compute_score(sandbox_url, None, 512, RIGHT, "{bad")[0] == 0.0


def test_sandbox_fusion_unreachable_server_is_an_api_error():
    from verl.utils.reward_score.sandbox_fusion.utils import call_sandbox_api, check_correctness

    reply, error = call_sandbox_api("http://127.0.0.1:9/run_code", "print(1)", "", 1, 1, 128)
    assert reply is None and "sandbox API error" in error
    results, meta = check_correctness("http://127.0.0.1:9/run_code", {"inputs": ["1"], "outputs": ["1"]}, "print(1)")
    assert results == [-1] and meta[0]["status"] == "api_error"
    assert call_sandbox_api("http://x", "", "", 1, 1, 1, language="cobol") == (None, "Unsupported language: cobol")


# ------------------------------------------------------------------------------------------ the rest

def test_math_batch_and_default_compute_score_lookup():
    from verl.utils.reward_score.math_batch import compute_score_batched

    got = compute_score_batched(["lighteval/MATH"] * 3, ["\\boxed{4}", "\\boxed{5}", "no box"], ["4", "4", "4"],
                                [None] * 3)
    assert got == [1.0, 0.0, 0.0]
    assert get_default_compute_score("naive") is default_compute_score


def test_math_verify_scores_with_the_package_or_says_how_to_install_it():
    from verl.utils.reward_score import math_verify

    try:
        import math_verify as _  # noqa: F401
    except ImportError:
        with pytest.raises(ImportError, match="pip install math-verify"):
            math_verify.compute_score("\\boxed{4}", "4")
        return
    assert math_verify.compute_score("so \\boxed{4}", "4") == 1.0
    assert math_verify.compute_score("so \\boxed{5}", "4") == 0.0


def test_reward_sandbox_fusion_url_in_the_config_reaches_the_code_scorer(sandbox_url):
    from omegaconf import OmegaConf

    from verl.trainer.ppo.reward import load_reward_manager

    _FakeSandbox.requests.clear()
    config = OmegaConf.create({"reward": {"sandbox_fusion": {"url": sandbox_url, "memory_limit_mb": 256}},
                               "reward_model": {"reward_manager": "naive"}, "data": {"reward_fn_key": "data_source"}})
    manager = load_reward_manager(config, tokenizer=None)
    assert manager.compute_score("taco", RIGHT, json.dumps(ADD_TWO)) == 1.0
    assert len(_FakeSandbox.requests) == 3 and _FakeSandbox.requests[0]["memory_limit_MB"] == 256
    plain = load_reward_manager(OmegaConf.create({"reward_model": {"reward_manager": "naive"}}), tokenizer=None)
    assert plain.compute_score is default_compute_score
