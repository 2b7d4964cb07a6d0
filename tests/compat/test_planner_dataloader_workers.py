"""data.dataloader_num_workers: `auto` is sized by the plan from the cores present, with a reason."""
import dataclasses

import pytest

from verl.compat.apply.apply_plan import resolve_config
from verl.compat.device.catalog import get_profile
from verl.compat.device.detect import detect_profile, host_cpu_count
from verl.compat.planning.planner import PlanError, make_plan
from verl.compat.device.profile import SoftwareInfo
from verl.trainer.config_check import load_config

SOFTWARE = SoftwareInfo(torch_version="2.11.0")


def _plan(device, cores, overrides=()):
    profile = dataclasses.replace(get_profile(device), host_cpu_count=cores)
    return make_plan(profile, load_config(list(overrides), check=False), SOFTWARE, None)


@pytest.mark.parametrize("device,cores,gpus,expected", [
    ("h100", 2, 1, 0),        # the field report's 2-core box: no loader processes (was 8, a warning every run)
    ("h100", 16, 1, 7),
    ("h100", 16, 8, 4),
    ("h100", 128, 8, 8),      # never more than upstream's 8
    ("cpu", 64, 1, 0),        # CPU training needs its cores
])
def test_auto_follows_the_cores(device, cores, gpus, expected):
    plan = _plan(device, cores, [f"trainer.n_gpus_per_node={gpus}"])
    assert plan.dataloader_num_workers == expected
    assert str(cores) in plan.reasons["data.dataloader_num_workers"]


def test_a_user_value_wins_and_a_bad_one_is_refused():
    plan = _plan("h100", 2, ["data.dataloader_num_workers=3"])
    assert plan.dataloader_num_workers == 3 and plan.reasons["data.dataloader_num_workers"] == "set by the user"
    with pytest.raises(PlanError, match="dataloader_num_workers"):
        _plan("h100", 2, ["data.dataloader_num_workers=-1"])


def test_the_real_profile_counts_cores_and_the_plan_resolves_the_config():
    profile = detect_profile()
    assert profile.host_cpu_count == host_cpu_count() > 0
    config = load_config([], check=False)
    assert config.data.dataloader_num_workers == "auto"
    plan = make_plan(profile, config, SOFTWARE, None)
    resolve_config(config, plan)
    assert config.data.dataloader_num_workers == plan.dataloader_num_workers
