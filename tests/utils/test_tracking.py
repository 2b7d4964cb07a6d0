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
