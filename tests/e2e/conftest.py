"""End-to-end runs of the stock `python -m verl.trainer.main_ppo` in a subprocess (CPU).

Each run starts and stops its own Ray instance inside main_ppo, exactly as a user's run does, so these
tests do not use the session's `ray_session`. Every subprocess has a time limit.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
from shared_data import DATA_ENV, data_root  # noqa: E402  (tests/ is on sys.path through tests/conftest.py)

# the real GSM8K jsonl files: $VERL_TEST_DATA/gsm8k, else ../shared/data/gsm8k beside the checkout (CI's)
GSM8K_SOURCE = data_root() / "gsm8k"
RUN_TIMEOUT_S = 420

_CONSOLE_LINE = re.compile(r"^step:(\d+) - (.*)$")


def run_main_ppo(overrides: list[str], log_path: Path | None = None, timeout: int = RUN_TIMEOUT_S,
                 env: dict[str, str] | None = None, ray_address: str | None = None):
    """Run main_ppo with Hydra overrides (in `env`, else this process's environment); return
    (completed process, {step: metrics} from the file logger).

    Without `ray_address` the run starts its own Ray instance; with it, it attaches to that cluster.
    Without a `trainer.default_local_dir` override the run gets a fresh one: the default (checkpoints/ in
    the checkout) is locked by a run that may resume from it, and another test may be running there.
    """
    if not any(o.startswith("trainer.default_local_dir=") for o in overrides):
        overrides = [*overrides, f"trainer.default_local_dir={tempfile.mkdtemp(prefix='run-', dir=_RUN_DIRS[0])}"]
    env = {k: v for k, v in (os.environ if env is None else env).items() if k != "RAY_ADDRESS"}
    env["PYTHONUNBUFFERED"] = "1"
    if ray_address is not None:
        env["RAY_ADDRESS"] = ray_address
    if log_path is not None:
        env["VERL_FILE_LOGGER_PATH"] = str(log_path)
    proc = subprocess.run([sys.executable, "-m", "verl.trainer.main_ppo", *overrides], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        print(proc.stdout[-6000:])
        print(proc.stderr[-6000:], file=sys.stderr)
    return proc, file_metrics(log_path)


def file_metrics(log_path: Path | None) -> dict[int, dict[str, float]]:
    """{step: metrics} from the file logger's JSON lines."""
    steps = {}
    if log_path is not None and log_path.exists():
        for line in log_path.read_text().splitlines():
            record = json.loads(line)
            steps.setdefault(record["step"], {}).update(record["data"])
    return steps


def console_metrics(stdout: str) -> dict[int, dict[str, float]]:
    """The console logger's `step:N - key:value - ...` lines, parsed."""
    steps = {}
    for line in stdout.splitlines():
        match = _CONSOLE_LINE.match(line.strip())
        if match:
            pairs = (item.rsplit(":", 1) for item in match.group(2).split(" - "))
            steps.setdefault(int(match.group(1)), {}).update({k: float(v) for k, v in pairs})
    return steps


_RUN_DIRS: list[Path] = []   # the session's folder for runs' default_local_dir (see run_main_ppo)


@pytest.fixture(scope="session", autouse=True)
def _run_dirs(tmp_path_factory):
    _RUN_DIRS.insert(0, tmp_path_factory.mktemp("runs"))
    yield
    _RUN_DIRS.pop(0)


@pytest.fixture(scope="session")
def gsm8k_data(tmp_path_factory) -> Path:
    """train.parquet / test.parquet written by examples/data_preprocess/gsm8k.py from the real files."""
    if not GSM8K_SOURCE.is_dir():
        pytest.skip(f"real data 'gsm8k' not found in {data_root()} (set {DATA_ENV} to the folder that holds it)")
    out = tmp_path_factory.mktemp("gsm8k")
    subprocess.run([sys.executable, "examples/data_preprocess/gsm8k.py", "--local_dataset_path", str(GSM8K_SOURCE),
                    "--local_save_dir", str(out)], cwd=REPO_ROOT, check=True, timeout=300)
    return out


@pytest.fixture(scope="session")
def gsm8k_model(tmp_path_factory) -> Path:
    """A tiny Qwen2 whose tokenizer was trained on GSM8K questions (so prompts stay ~100 tokens)."""
    from verl.utils.tiny_model import build_tiny_model_dir

    questions = [json.loads(line)["question"] for line in (GSM8K_SOURCE / "train.jsonl").open()][:2000] \
        if GSM8K_SOURCE.is_dir() else None
    return Path(build_tiny_model_dir(str(tmp_path_factory.mktemp("gsm8k_model")), corpus_texts=questions,
                                     vocab_size=1024))


def _make_task():
    """examples/demo/make_task.py, the demo's own task builder (not a package, so imported by path)."""
    sys.path.insert(0, str(REPO_ROOT / "examples" / "demo"))
    try:
        import make_task
    finally:
        sys.path.pop(0)
    return make_task


@pytest.fixture(scope="session")
def demo_task(tmp_path_factory):
    """The demo's task (answer with the digit 7) and its tiny model: (model_dir, train_file, test_file)."""
    return _make_task().build(str(tmp_path_factory.mktemp("demo")), digits="7")


@pytest.fixture(scope="session")
def copy_task(tmp_path_factory):
    """The demo task with all ten digits (prompts differ, so greedy answers differ between rows)."""
    return _make_task().build(str(tmp_path_factory.mktemp("copy")), digits="0123456789", train_size=64)
