"""Checks of the run's inputs, made in the driver before training starts, reported together in one message.

A missing or misnamed data file, an unreadable format, raw (unprocessed) data, an empty set, an
over-long prompt or a logger whose package is missing would otherwise surface one at a time, each
after a cluster start-up or some steps in. `input_problems(config)` finds what it can from the
config and the files alone, before Ray starts; `task_runner.build_inputs` adds what building the data
sets finds (on a thread, while Ray starts) and raises `InputError` with everything at once.
"""
from __future__ import annotations

import importlib.util
import json
import os

DATA_SUFFIXES = (".parquet", ".jsonl", ".json")
LOGGER_PACKAGES = {"wandb": "wandb", "tensorboard": "tensorboard"}


class InputError(ValueError):
    """The run's data or logger settings cannot work; the message lists every problem found."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        super().__init__("\n".join(f"- {p}" for p in self.problems))


def _paths(value) -> list[str]:
    if value is None:
        return []
    return [str(value)] if isinstance(value, str) else [str(v) for v in value]


def file_problem(key: str, path: str, prompt_key: str = "prompt") -> str | None:
    """What is wrong with one data file named by `data.<key>`, or None."""
    full = os.path.expanduser(path)
    if os.path.isdir(full):
        inside = sorted(f for f in os.listdir(full) if f.endswith(DATA_SUFFIXES))
        hint = f" (it holds {inside[:4]})" if inside else ""
        return f"data.{key}: {path} is a folder, not a file{hint}; name the file(s), e.g. data.{key}={path}/train.parquet"
    if not os.path.exists(full):
        return f"data.{key}: {path} does not exist"
    if full.endswith((".csv", ".tsv")):
        return (f"data.{key}: {path} is CSV, which is not read; convert it to parquet (e.g. "
                f"pandas.read_csv(path).to_parquet(...)) with a {prompt_key!r} column of chat messages")
    if not full.endswith(DATA_SUFFIXES):
        return f"data.{key}: {path} has an unsupported format; use .parquet, .jsonl or .json"
    if full.endswith(".jsonl"):
        return _raw_jsonl_problem(key, path, full, prompt_key)
    return None


def _raw_jsonl_problem(key: str, path: str, full: str, prompt_key: str) -> str | None:
    """A JSON-lines file whose first row has no prompt column is most likely raw data (GSM8K's own files)."""
    with open(full) as f:
        first = f.readline().strip()
    try:
        row = json.loads(first) if first else {}
    except json.JSONDecodeError:
        return f"data.{key}: {path}: the first line is not JSON"
    if not isinstance(row, dict) or prompt_key in row:
        return None
    if {"question", "answer"} <= set(row):
        return (f"data.{key}: {path} looks like raw GSM8K (question/answer, no {prompt_key!r} column). Turn it into "
                "verl's format first: python examples/data_preprocess/gsm8k.py --local_dataset_path "
                f"{os.path.dirname(os.path.abspath(full))} --local_save_dir ~/data/gsm8k, then use its train.parquet / "
                "test.parquet")
    return f"data.{key}: {path} has no {prompt_key!r} column (data.prompt_key); its first row has {sorted(row)}"


def logger_problems(loggers) -> list[str]:
    loggers = [loggers] if isinstance(loggers, str) else list(loggers or [])
    return [f"trainer.logger includes {name!r} but the {package} package is not installed: `pip install {package}`, "
            f"or drop {name!r} from trainer.logger" for name, package in LOGGER_PACKAGES.items()
            if name in loggers and importlib.util.find_spec(package) is None]


def input_problems(config) -> list[str]:
    """Every problem visible without reading the data sets whole: files, formats, logger packages."""
    data = config.data
    prompt_key = data.get("prompt_key", "prompt") or "prompt"
    problems = []
    for key in ("train_files", "val_files"):
        paths = _paths(data.get(key))
        if not paths:
            problems.append(f"data.{key} is not set")
        problems.extend(p for p in (file_problem(key, path, prompt_key) for path in paths) if p)
    problems.extend(logger_problems(config.trainer.get("logger")))
    problems.extend(reward_model_problems(config))
    return problems


def reward_model_problems(config) -> list[str]:
    """A reward model folder that is missing or has no classification head."""
    from verl.compat.reward_model import reward_model_enabled, rm_setting, rm_setting_key

    path = rm_setting(config, "model_path")
    if not reward_model_enabled(config) or not path:
        return []
    from verl.workers.reward_model.inputs import classification_head_problem

    problem = classification_head_problem(str(path), rm_setting_key(config, "model_path"))
    return [problem] if problem else []
