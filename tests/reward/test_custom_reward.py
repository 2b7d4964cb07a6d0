"""Loading a user's reward function from `custom_reward_function`, and building the reward manager."""

import textwrap

import pytest
import torch
from omegaconf import OmegaConf

from verl.trainer.ppo.reward import compute_reward, get_custom_reward_fn, load_reward_manager
from verl.utils.reward_score import default_compute_score
from verl.workers.reward_manager import NaiveRewardManager, get_reward_manager_cls, register


def make_config(path=None, name=None, **extra):
    """The reward-related part of the trainer config, struct-locked like Hydra's."""
    config = OmegaConf.create(
        {
            "data": {"reward_fn_key": "data_source"},
            "custom_reward_function": {"path": path, "name": name},
            "reward_model": {"reward_manager": "naive"},
            **extra,
        }
    )
    OmegaConf.set_struct(config, True)
    return config


def write(tmp_path, source, filename="my_reward.py"):
    path = tmp_path / filename
    path.write_text(textwrap.dedent(source))
    return str(path)


GOOD = """
import re

def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):
    return float(solution_str.strip() == ground_truth) + bonus

def length_reward(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": len(solution_str) / 10, "length": len(solution_str)}
"""


def test_no_path_means_no_custom_function():
    assert get_custom_reward_fn(make_config()) is None


def test_loads_the_named_function(tmp_path):
    fn = get_custom_reward_fn(make_config(write(tmp_path, GOOD), "length_reward"))
    assert fn("d", "abcd", "x") == {"score": 0.4, "length": 4}


def test_name_defaults_to_compute_score(tmp_path):
    fn = get_custom_reward_fn(make_config(write(tmp_path, GOOD)))
    assert fn(data_source="d", solution_str="7", ground_truth="7") == 1.0


def test_reward_kwargs_reach_every_call(tmp_path):
    config = OmegaConf.create(
        {"custom_reward_function": {"path": write(tmp_path, GOOD), "name": None, "reward_kwargs": {"bonus": 0.25}}}
    )
    fn = get_custom_reward_fn(config)
    assert fn(data_source="d", solution_str="7", ground_truth="7") == 1.25


def test_upstream_0_9_1_location_is_read_too(tmp_path):
    config = OmegaConf.create(
        {
            "custom_reward_function": {"path": None, "name": None},
            "reward": {"custom_reward_function": {"path": write(tmp_path, GOOD), "name": "length_reward"}},
        }
    )
    assert get_custom_reward_fn(config)("d", "ab", "x")["length"] == 2


def test_missing_file_is_named(tmp_path):
    with pytest.raises(FileNotFoundError) as err:
        get_custom_reward_fn(make_config(str(tmp_path / "nope.py"), "compute_score"))
    assert "custom_reward_function.path" in str(err.value) and "nope.py" in str(err.value)


def test_import_error_names_the_file_and_the_line(tmp_path):
    path = write(tmp_path, "import os\nimport package_that_is_not_installed_xyz\n")
    with pytest.raises(RuntimeError) as err:
        get_custom_reward_fn(make_config(path, "compute_score"))
    message = str(err.value)
    assert path in message and "ModuleNotFoundError" in message
    assert "package_that_is_not_installed_xyz" in message and "line 2" in message


def test_syntax_error_names_the_file(tmp_path):
    path = write(tmp_path, "def compute_score(:\n    pass\n")
    with pytest.raises(RuntimeError, match="SyntaxError") as err:
        get_custom_reward_fn(make_config(path, "compute_score"))
    assert path in str(err.value)


def test_missing_function_lists_what_the_file_defines(tmp_path):
    path = write(tmp_path, GOOD)
    with pytest.raises(AttributeError) as err:
        get_custom_reward_fn(make_config(path, "compute_reward"))
    message = str(err.value)
    assert "'compute_reward'" in message and path in message
    # only functions defined in the file are offered, not modules or names it imports
    assert "it defines: compute_score, length_reward." in message


def test_non_callable_is_rejected(tmp_path):
    path = write(tmp_path, "compute_score = 3\n")
    with pytest.raises(TypeError, match="not a function"):
        get_custom_reward_fn(make_config(path, "compute_score"))


def test_load_reward_manager_defaults_to_the_builtin_rules():
    manager = load_reward_manager(make_config(), tokenizer=None, num_examine=1)
    assert isinstance(manager, NaiveRewardManager)
    assert manager.compute_score is default_compute_score
    assert manager.num_examine == 1 and manager.reward_fn_key == "data_source"


def test_load_reward_manager_wraps_the_custom_function(tmp_path):
    config = make_config(write(tmp_path, GOOD), "length_reward")
    manager = load_reward_manager(config, None, 0)
    assert manager.compute_score("d", "abc", "x")["length"] == 3


def test_load_reward_manager_reads_0_9_1_manager_name():
    config = OmegaConf.create({"reward": {"reward_manager": {"name": "naive"}}})
    assert isinstance(load_reward_manager(config, None), NaiveRewardManager)


def test_unknown_manager_name_lists_the_known_ones():
    config = make_config()
    config.reward_model.reward_manager = "no_such_manager"   # ("prime" is built in now)
    with pytest.raises(ValueError, match="naive"):
        load_reward_manager(config, None)


def test_user_registered_manager_is_found():
    @register("test_constant")
    class Constant:
        def __init__(self, tokenizer, num_examine, compute_score=None, reward_fn_key="data_source", value=0.0):
            self.value = value

        def __call__(self, data):
            return torch.full((2, 3), self.value)

    assert get_reward_manager_cls("test_constant") is Constant
    config = make_config()
    config.reward_model.reward_manager = "test_constant"
    manager = load_reward_manager(config, None, 0, value=2.0)
    tensor, extra = compute_reward(None, manager)  # a manager without return_dict still works
    assert extra == {} and torch.equal(tensor, torch.full((2, 3), 2.0))


def test_compute_reward_takes_a_tensor_from_a_kwargs_function():
    tensor, extra = compute_reward(None, lambda data, **kwargs: torch.ones(2, 3))
    assert extra == {} and torch.equal(tensor, torch.ones(2, 3))


def test_manager_class_from_a_file(tmp_path):
    path = write(
        tmp_path,
        """
        class Halves:
            def __init__(self, tokenizer, num_examine, compute_score, reward_fn_key):
                self.compute_score = compute_score
        """,
        "my_manager.py",
    )
    config = OmegaConf.create(
        {"reward": {"reward_manager": {"source": "importlib", "name": "Halves", "module": {"path": path}}}}
    )
    manager = load_reward_manager(config, None)
    assert type(manager).__name__ == "Halves" and manager.compute_score is default_compute_score
    config.reward.reward_manager.name = "Thirds"
    with pytest.raises(AttributeError, match="reward.reward_manager.name='Thirds'.*Halves"):
        load_reward_manager(config, None)


def test_custom_function_survives_ray_pickling(tmp_path):
    """Ray ships functions with cloudpickle; a user's file is not importable elsewhere, so it goes by value."""
    import pickle

    from ray import cloudpickle

    config = OmegaConf.create(
        {"custom_reward_function": {"path": write(tmp_path, GOOD), "name": None, "reward_kwargs": {"bonus": 1.0}}}
    )
    copy = pickle.loads(cloudpickle.dumps(get_custom_reward_fn(config)))
    assert copy(data_source="d", solution_str="7", ground_truth="7") == 2.0
