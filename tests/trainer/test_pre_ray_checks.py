"""Every input problem stops `task_runner.run_ppo` before `ray.init` (a stand-in for it fails the test if
reached), with an InputError naming the key or file: empty data, no prompt column, over-long prompts with
filtering off, a model path that does not exist or has no config.json, a tokenizer that does not load, a
reward file that does not exist or lacks the function, and a second live run in the same output folder.
"""
import os
import shutil
import sys
from pathlib import Path

import pandas as pd
import pytest

from verl.trainer.config_check import load_config
from verl.trainer.ppo import task_runner
from verl.trainer.preflight import InputError

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    sys.path.insert(0, str(REPO_ROOT / "examples" / "demo"))
    try:
        import make_task
    finally:
        sys.path.pop(0)
    return make_task.build(str(tmp_path_factory.mktemp("demo")), train_size=16, test_size=8)


@pytest.fixture(autouse=True)
def no_ray(monkeypatch):
    def reached(config):
        raise AssertionError("ray.init was reached: the input problem was not found before Ray")

    monkeypatch.setattr(task_runner, "_init_ray", reached)


def _config(task, tmp_path, *overrides):
    model, train, test = task
    return load_config([f"data.train_files={train}", f"data.val_files={test}", f"actor_rollout_ref.model.path={model}",
                        "trainer.logger=[console]", "trainer.n_gpus_per_node=1", "trainer.device=cpu",
                        "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
                        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8", "algorithm.adv_estimator=grpo",
                        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8", "actor_rollout_ref.rollout.n=2",
                        f"trainer.default_local_dir={tmp_path / 'ckpt'}", *overrides])


def _fails_before_ray(config, *fragments):
    with pytest.raises(InputError) as caught:
        task_runner.run_ppo(config)
    for fragment in fragments:
        assert fragment in str(caught.value), str(caught.value)
    return str(caught.value)


def test_empty_data_and_a_missing_prompt_column(task, tmp_path):
    _, train, _ = task
    empty, no_prompt = tmp_path / "empty.parquet", tmp_path / "raw.parquet"
    pd.read_parquet(train).iloc[:0].to_parquet(empty)
    pd.read_parquet(train).rename(columns={"prompt": "question"}).to_parquet(no_prompt)
    _fails_before_ray(_config(task, tmp_path, f"data.train_files={empty}", f"data.val_files={no_prompt}"),
                      f"data.train_files: the data set is empty ({empty}", f"data.val_files: {no_prompt} has no 'prompt' column")


def test_overlong_prompts_with_filtering_off(task, tmp_path):
    _fails_before_ray(_config(task, tmp_path, "data.max_prompt_length=4", "data.filter_overlong_prompts=False"),
                      "over data.max_prompt_length=4")


def test_a_model_path_that_does_not_exist_or_has_no_config(task, tmp_path):
    _fails_before_ray(_config(task, tmp_path, f"actor_rollout_ref.model.path={tmp_path / 'nope'}"),
                      f"actor_rollout_ref.model.path={tmp_path / 'nope'} does not exist")
    no_config = tmp_path / "weights_only"
    shutil.copytree(task[0], no_config)
    os.remove(no_config / "config.json")
    _fails_before_ray(_config(task, tmp_path, f"actor_rollout_ref.model.path={no_config}"),
                      f"actor_rollout_ref.model.path={no_config} has no config.json")


def test_a_tokenizer_that_does_not_load(task, tmp_path):
    broken = tmp_path / "tokenizer"
    broken.mkdir()
    (broken / "tokenizer.json").write_text("{not json")
    (broken / "tokenizer_config.json").write_text("{}")
    _fails_before_ray(_config(task, tmp_path, f"actor_rollout_ref.model.tokenizer_path={broken}"),
                      f"actor_rollout_ref.model.tokenizer_path={broken}: the tokenizer does not load")


def test_a_reward_file_that_does_not_exist_or_lacks_the_function(task, tmp_path):
    _fails_before_ray(_config(task, tmp_path, f"custom_reward_function.path={tmp_path / 'missing.py'}"),
                      "custom_reward_function.path", "missing.py")
    reward = tmp_path / "reward.py"
    reward.write_text("def score(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.0\n")
    _fails_before_ray(_config(task, tmp_path, f"custom_reward_function.path={reward}",
                              "custom_reward_function.name=compute_reward"),
                      "compute_reward", str(reward))


def test_a_second_live_run_in_the_same_output_folder_stops_at_once_naming_the_first(task, tmp_path):
    from verl.utils.checkpoint.run_lock import RunLock

    config = _config(task, tmp_path)
    with RunLock(str(tmp_path / "ckpt")):             # the first run, alive
        message = _fails_before_ray(config, f"another run is using the output folder {tmp_path / 'ckpt'}",
                                    f"pid {os.getpid()} on host")
    assert "trainer.default_local_dir" in message


def test_a_run_that_neither_saves_nor_resumes_runs_beside_another(task, tmp_path):
    """No checkpoint written or read (save_freq=-1, resume_mode=disable): the folder is untouched, so no lock."""
    from verl.trainer.ppo.task_runner import _output_lock
    from verl.utils.checkpoint.run_lock import RunLock

    with RunLock(str(tmp_path / "ckpt")):
        with _output_lock(_config(task, tmp_path, "trainer.save_freq=-1", "trainer.resume_mode=disable")):
            pass
        with pytest.raises(InputError, match="another run is using"):
            with _output_lock(_config(task, tmp_path, "trainer.save_freq=-1")):   # resume auto reads the folder
                pass
