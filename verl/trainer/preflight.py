"""Checks of the run's inputs, made in the driver before Ray starts, reported together in one message.

A missing or misnamed data file, an unreadable format, raw (unprocessed) data, an empty set, an
over-long prompt, a model folder without config.json, a tokenizer or reward file that does not load, or
a logger whose package is missing would otherwise surface one at a time, each after a cluster start-up
or some steps in. `input_problems(config)` finds what it can from the config and the files alone (file
metadata, no data read whole); `task_runner.build_inputs` adds what loading the tokenizer and the reward
function and building the data sets finds, and raises `InputError` with everything at once. Both finish
before `ray.init`.
"""
from __future__ import annotations

import importlib.util
import json
import os

from omegaconf import OmegaConf

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
    if full.endswith(".parquet"):
        return _parquet_problem(key, path, full, prompt_key)
    return None


def _parquet_problem(key: str, path: str, full: str, prompt_key: str) -> str | None:
    """No rows, or no prompt column, read from the file's footer alone."""
    import pyarrow.parquet as pq

    try:
        meta = pq.read_metadata(full)
    except Exception as err:  # noqa: BLE001 - any unreadable footer is the same problem for the user
        return f"data.{key}: {path} is not a readable parquet file ({type(err).__name__}: {err})"
    if meta.num_rows == 0:
        return f"data.{key}: the data set is empty ({path} has no rows)"
    columns = meta.schema.to_arrow_schema().names
    if prompt_key not in columns:
        return f"data.{key}: {path} has no {prompt_key!r} column (data.prompt_key); its columns are {sorted(columns)}"
    return None


def _raw_jsonl_problem(key: str, path: str, full: str, prompt_key: str) -> str | None:
    """A JSON-lines file whose first row has no prompt column is most likely raw data (GSM8K's own files)."""
    with open(full) as f:
        first = f.readline().strip()
    if not first:
        return f"data.{key}: the data set is empty ({path} has no rows)"
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


def _hub_problem(key: str, repo_id: str) -> str | None:
    """A hub id can only be used offline when it is in the local Hugging Face cache."""
    if os.environ.get("HF_HUB_OFFLINE", "0").lower() in ("0", "false", ""):
        return None  # downloaded by the workers
    from huggingface_hub import try_to_load_from_cache

    if isinstance(try_to_load_from_cache(repo_id, "config.json"), str):
        return None
    return (f"{key}={repo_id}: no local folder of that name, and the Hugging Face hub id is not in the local cache "
            "while HF_HUB_OFFLINE is set; download it first or point the key at a local model folder")


def model_problems(config) -> list[str]:
    """Model and tokenizer paths: a local folder must exist (a model's must hold config.json); a hub id is
    accepted (it is downloaded), unless offline and not cached."""
    from verl.trainer.config_check import need_critic
    from verl.utils.fs import _looks_like_repo_id, is_non_local

    keys = [("actor_rollout_ref.model.path", True), ("actor_rollout_ref.model.tokenizer_path", False)]
    if need_critic(config):
        keys += [("critic.model.path", True), ("critic.model.tokenizer_path", False)]
    problems, seen = [], set()
    for key, is_model in keys:
        path = OmegaConf.select(config, key, default=None)
        if path is None or (str(path), is_model) in seen or is_non_local(str(path)):
            continue
        seen.add((str(path), is_model))
        full = os.path.expanduser(str(path))
        if os.path.isdir(full):
            if is_model and not os.path.isfile(os.path.join(full, "config.json")):
                inside = sorted(os.listdir(full))
                problems.append(f"{key}={path} has no config.json (it holds {inside[:6]}); point it at the folder "
                                "that save_pretrained wrote (config.json and the weights)")
        elif os.path.exists(full):
            problems.append(f"{key}={path} is a file; point it at the model's folder")
        elif _looks_like_repo_id(str(path)):
            problem = _hub_problem(key, str(path))
            if problem:
                problems.append(problem)
        else:
            problems.append(f"{key}={path} does not exist")
    return problems


def input_problems(config) -> list[str]:
    """Every problem visible without reading the data sets whole: files, formats, model folders, logger
    packages."""
    data = config.data
    prompt_key = data.get("prompt_key", "prompt") or "prompt"
    problems = []
    for key in ("train_files", "val_files"):
        paths = _paths(data.get(key))
        if not paths:
            problems.append(f"data.{key} is not set")
        problems.extend(p for p in (file_problem(key, path, prompt_key) for path in paths) if p)
    if OmegaConf.select(config, "actor_rollout_ref.model", default=None) is not None:
        problems.extend(model_problems(config))
    problems.extend(logger_problems(config.trainer.get("logger")))
    problems.extend(reward_model_problems(config))
    problems.extend(multi_turn_problems(config))
    return problems


def scorer_problems(config, datasets: dict) -> list[str]:
    """The built-in scorer of every data source in the data, tried once on an empty answer, so that a scorer
    whose package is missing (geo3k's mathruler) or a data source without one stops the run here, not after
    the first rollout. Skipped when a custom reward function or a reward model scores instead."""
    from verl.compat.planning.reward_model import reward_model_enabled
    from verl.utils.reward_score import _CODE_SOURCES, default_compute_score

    custom = any(OmegaConf.select(config, f"{key}.path", default=None)
                 for key in ("custom_reward_function", "reward.custom_reward_function"))
    if custom or reward_model_enabled(config):
        return []
    problems = []
    for key, dataset in datasets.items():
        table = getattr(dataset, "table", None)
        if table is None or "data_source" not in table.column_names:
            continue
        for source in sorted(str(s) for s in table.column("data_source").unique().to_pylist()):
            if source in _CODE_SOURCES:   # run in a sandbox or a child process: nothing to import here
                continue
            try:
                default_compute_score(source, "", "0")
            except (ImportError, NotImplementedError) as err:
                problems.append(f"{key}: data_source {source!r}: {err}")
            except Exception:  # noqa: BLE001 - an empty answer may be what a scorer rejects; it imported
                pass
    return list(dict.fromkeys(problems))


def reward_model_problems(config) -> list[str]:
    """A reward model folder that is missing or has no classification head."""
    from verl.compat.planning.reward_model import reward_model_enabled, rm_setting, rm_setting_key

    path = rm_setting(config, "model_path")
    if not reward_model_enabled(config) or not path:
        return []
    from verl.workers.reward_model.inputs import classification_head_problem

    problem = classification_head_problem(str(path), rm_setting_key(config, "model_path"))
    return [problem] if problem else []


_MT = "actor_rollout_ref.rollout.multi_turn"


def multi_turn_problems(config) -> list[str]:
    """With multi_turn.enable: the tool config parses, every tool class imports and builds, the tool-call
    format and truncation side are known (the same loading the rollout worker does, here before Ray)."""
    mt = OmegaConf.select(config, _MT, default=None)
    if mt is None or not mt.get("enable", False):
        return []
    from verl.experimental.agent_loop.tool_parser import ToolParser

    problems = []
    fmt = mt.get("format", "hermes")
    if fmt not in ToolParser._registry:
        problems.append(f"{_MT}.format={fmt!r} is not a tool-call format this verl parses; use one of "
                        f"{sorted(ToolParser._registry)}")
    if mt.get("tool_response_truncate_side", "middle") not in ("left", "middle", "right"):
        problems.append(f"{_MT}.tool_response_truncate_side={mt.get('tool_response_truncate_side')!r}: use left, "
                        "middle or right")
    for key in ("tool_config_path", "function_tool_path"):
        path = mt.get(key)
        if path and not os.path.isfile(os.path.expanduser(str(path))):
            problems.append(f"{_MT}.{key}={path!r}: no such file")
    if not problems:
        problems.extend(_tool_load_problems(mt))
    return problems


def _tool_load_problems(mt) -> list[str]:
    import yaml

    path = mt.get("tool_config_path")
    if path:
        try:
            with open(os.path.expanduser(str(path))) as f:
                parsed = yaml.safe_load(f)
        except yaml.YAMLError as e:
            return [f"{_MT}.tool_config_path={path!r} is not valid YAML: {e}"]
        tools = parsed.get("tools") if isinstance(parsed, dict) else None
        if not isinstance(tools, list):
            return [f"{_MT}.tool_config_path={path!r} must hold a `tools:` list (class_name, config, tool_schema "
                    "per entry)"]
        problems = []
        for i, entry in enumerate(tools):
            name = entry.get("class_name") if isinstance(entry, dict) else None
            if not isinstance(name, str) or "." not in name:
                problems.append(f"{path}: tools[{i}].class_name must be a dotted path module.Class, got {name!r}")
                continue
            module_name, _, class_name = name.rpartition(".")
            try:
                getattr(importlib.import_module(module_name), class_name)
            except (ImportError, AttributeError) as e:
                problems.append(f"{path}: tools[{i}].class_name={name!r} does not import ({type(e).__name__}: {e})")
        if problems:
            return problems
    from verl.workers.rollout.multi_turn import load_tools

    try:
        load_tools(mt)
    except Exception as e:   # the tool's own constructor or schema validation: report it with the file
        where = " / ".join(str(mt.get(k)) for k in ("tool_config_path", "function_tool_path") if mt.get(k))
        return [f"{_MT}: the tools in {where} do not build: {type(e).__name__}: {e}"]
    return []
