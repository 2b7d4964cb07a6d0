"""Input checks in the driver, before Ray: every problem with the data files, the data sets and the logger
packages is found and reported in one InputError (unit level; tests/e2e/test_input_errors.py runs main_ppo)."""
import importlib.util
import json

import pandas as pd
import pytest
from omegaconf import OmegaConf
from transformers import AutoTokenizer

from shared_data import tiny_tokenizer_dir
from verl.trainer.ppo.task_runner import _checked_datasets
from verl.trainer.preflight import InputError, file_problem, input_problems



def _row(question):
    return {"data_source": "d", "prompt": [{"role": "user", "content": question}],
            "reward_model": {"ground_truth": "1"}, "extra_info": {"index": 0}}


def _config(train, val, **data):
    return OmegaConf.create({
        "data": {"train_files": train, "val_files": val, "prompt_key": "prompt", "max_prompt_length": 32,
                 "truncation": "error", "filter_overlong_prompts": False, "shuffle": False, **data},
        "trainer": {"logger": ["console"]},
    })


def test_each_kind_of_bad_file_is_explained(tmp_path):
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "train.parquet").touch()
    csv = tmp_path / "data.csv"
    csv.write_text("prompt\nhi\n")
    raw = tmp_path / "train.jsonl"
    raw.write_text(json.dumps({"question": "2+2?", "answer": "#### 4"}) + "\n")
    assert "is a folder, not a file" in file_problem("train_files", str(tmp_path / "folder"))
    assert "train.parquet" in file_problem("train_files", str(tmp_path / "folder"))
    assert "does not exist" in file_problem("val_files", str(tmp_path / "nope.parquet"))
    assert "CSV" in file_problem("train_files", str(csv))
    assert "examples/data_preprocess/gsm8k.py" in file_problem("train_files", str(raw))
    good = tmp_path / "ok.jsonl"
    good.write_text(json.dumps(_row("hi")) + "\n")
    assert file_problem("train_files", str(good)) is None


def test_all_problems_come_in_one_error(tmp_path, monkeypatch):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real_find_spec(name, *a))
    (tmp_path / "folder").mkdir()
    config = _config(str(tmp_path / "folder"), str(tmp_path / "missing.parquet"))
    config.trainer.logger = ["console", "wandb"]
    problems = input_problems(config)
    assert len(problems) == 3
    assert any("folder" in p for p in problems) and any("missing.parquet" in p for p in problems)
    assert any("pip install wandb" in p for p in problems)
    with pytest.raises(InputError) as err:
        _checked_datasets(config, tokenizer=None)        # stops before any data set is read
    assert str(err.value).count("\n- ") == 2


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    corpus = ["short? a user assistant", " ".join(f"w{i}" for i in range(60)), "x " * 50] * 4
    return AutoTokenizer.from_pretrained(tiny_tokenizer_dir(tmp_path_factory.mktemp("tokenizer"), corpus))


def test_overlong_prompts_and_an_empty_set_are_found_before_training(tokenizer, tmp_path):
    train = tmp_path / "train.parquet"
    pd.DataFrame([_row("short?"), _row(" ".join(f"w{i}" for i in range(60))), _row("x " * 50)]).to_parquet(train)
    empty = tmp_path / "test.parquet"
    pd.DataFrame([_row("a")]).iloc[:0].to_parquet(empty)
    with pytest.raises(InputError) as err:       # the cheap file checks come first, and stop before tokenizing
        _checked_datasets(_config(str(train), str(empty)), tokenizer)
    assert "data.val_files: the data set is empty" in str(err.value)
    pd.DataFrame([_row("a")]).to_parquet(empty)
    with pytest.raises(InputError) as err:
        _checked_datasets(_config(str(train), str(empty)), tokenizer)
    message = str(err.value)
    assert "2 prompt(s) are over data.max_prompt_length=32" in message and "row 1 of" in message
    assert "filter_overlong_prompts=True" in message
    # the same files pass once over-long prompts are filtered
    train_set, val_set = _checked_datasets(_config(str(train), str(empty), filter_overlong_prompts=True), tokenizer)
    assert len(train_set) == 1 and len(val_set) == 1


def test_a_scorer_whose_package_is_missing_or_an_unknown_data_source_is_found_before_training(
        tokenizer, tmp_path, monkeypatch):
    """The built-in scorer of each data source in the data is tried once before Ray: geo3k without mathruler
    and a data source with no built-in scorer are reported, naming the file key and the source."""
    from verl.trainer.preflight import scorer_problems

    train, val = tmp_path / "train.parquet", tmp_path / "val.parquet"
    pd.DataFrame([{**_row("a"), "data_source": "hiyouga/geometry3k"}, {**_row("b"), "data_source": "openai/gsm8k"}]
                 ).to_parquet(train)
    pd.DataFrame([{**_row("c"), "data_source": "my/own-task"}]).to_parquet(val)
    config = _config(str(train), str(val))
    train_set, val_set = _checked_datasets(config, tokenizer)
    sets = {"data.train_files": train_set, "data.val_files": val_set}
    monkeypatch.setitem(__import__("sys").modules, "mathruler", None)   # the package is not installed
    monkeypatch.setitem(__import__("sys").modules, "mathruler.grader", None)
    problems = scorer_problems(config, sets)
    assert len(problems) == 2, problems
    assert problems[0].startswith("data.train_files: data_source 'hiyouga/geometry3k'") and "mathruler" in problems[0]
    assert problems[1].startswith("data.val_files: data_source 'my/own-task'") and "custom_reward_function" in problems[1]
    # a custom reward function scores every source: nothing to check
    custom = OmegaConf.merge(config, {"custom_reward_function": {"path": "my_reward.py"}})
    assert scorer_problems(custom, sets) == []
