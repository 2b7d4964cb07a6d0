"""Tracking: the file logger's upstream-compatible path and JSON-lines format, and clear backend errors."""
import importlib.util
import json

import numpy as np
import pytest
import torch

from verl.utils.tracking import Tracking


def test_file_logger_default_path_and_format(tmp_path, monkeypatch):
    monkeypatch.delenv("VERL_FILE_LOGGER_PATH", raising=False)
    monkeypatch.setenv("VERL_FILE_LOGGER_ROOT", str(tmp_path))
    tracker = Tracking("proj", "exp", default_backend=["console", "file"])
    tracker.log({"a/loss": torch.tensor(0.5), "b": np.float32(2.0), "c": 3, "bad": float("nan"), "skip": [1]}, step=1)
    tracker.log({"a/loss": 0.25}, step=2)
    tracker.finish()
    tracker.finish()  # idempotent
    lines = [json.loads(line) for line in (tmp_path / "proj" / "exp.jsonl").read_text().splitlines()]
    assert lines == [{"step": 1, "data": {"a/loss": 0.5, "b": 2.0, "c": 3, "bad": "nan"}},
                     {"step": 2, "data": {"a/loss": 0.25}}]


def test_file_logger_env_path(tmp_path, monkeypatch):
    path = tmp_path / "sub" / "run.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(path))
    tracker = Tracking("p", "e", default_backend="file")
    tracker.log({"x": 1.0}, step=7)
    tracker.finish()
    assert json.loads(path.read_text()) == {"step": 7, "data": {"x": 1.0}}


def test_unknown_backend_names_supported_ones():
    with pytest.raises(ValueError, match="console"):
        Tracking("p", "e", default_backend=["mlfloww"])


@pytest.mark.skipif(importlib.util.find_spec("wandb") is not None, reason="wandb is installed")
def test_wandb_missing_says_how_to_fix():
    with pytest.raises(ImportError, match="pip install wandb"):
        Tracking("p", "e", default_backend=["wandb"])


def _records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_file_logger_appends_on_resume_with_one_record_per_step(tmp_path, monkeypatch):
    """A run logs steps 0-5 (0: validation), dies; the resumed run continues at checkpoint step 3,
    validates before training (step 3 again) and logs 4-5 again: one record per step, history kept."""
    path = tmp_path / "run.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(path))
    first = Tracking("p", "e", default_backend="file")
    for step in range(6):
        first.log({"x": float(step)}, step=step)
    first.finish()
    with open(path, "a") as f:
        f.write('{"step": 6, "da')                    # a line cut short by the crash

    resumed = Tracking("p", "e", default_backend="file")
    resumed.continue_from(3)
    resumed.log({"val": 1.0}, step=3)
    resumed.log({"x": 40.0}, step=4)
    resumed.log({"x": 50.0}, step=5)
    resumed.finish()
    records = _records(path)
    assert [r["step"] for r in records] == [0, 1, 2, 3, 4, 5]
    assert records[3]["data"] == {"x": 3.0, "val": 1.0}
    assert records[4]["data"] == {"x": 40.0} and records[0]["data"] == {"x": 0.0}


def test_file_logger_fresh_file_starts_empty(tmp_path, monkeypatch):
    path = tmp_path / "new.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(path))
    tracker = Tracking("p", "e", default_backend="file")
    tracker.continue_from(0)
    tracker.log({"x": 1.0}, step=1)
    tracker.finish()
    assert _records(path) == [{"step": 1, "data": {"x": 1.0}}]
