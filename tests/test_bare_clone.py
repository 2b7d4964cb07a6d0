"""The README's test command on a fresh clone with nothing beside it: tests that need the real data skip with
one line naming it; nothing errors. The data and reward tests run here in such a clone."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(shutil.which("git") is None or not (REPO_ROOT / ".git").exists(),
                    reason="needs git and a git checkout to clone from")
def test_data_and_reward_tests_pass_in_a_bare_clone(tmp_path):
    clone = tmp_path / "alone" / "verl"
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(REPO_ROOT), str(clone)], check=True, timeout=60)
    env = {k: v for k, v in os.environ.items() if k != "VERL_TEST_DATA"}
    env["PYTHONPATH"] = str(clone)              # the clone's verl, not this checkout's editable install
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                           "tests/data", "tests/reward"], cwd=clone, env=env, capture_output=True, text=True,
                          timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    skips = [line for line in out.splitlines() if line.startswith("SKIPPED")]
    assert skips and all("not found in" in line for line in skips), skips
    assert any("'gsm8k'" in line for line in skips) and any("'qwen-tokenizer'" in line for line in skips)
    assert " passed" in out and "error" not in out.splitlines()[-1]
