"""vLLM-only rollout keys changed by the user while the built-in engine runs: one plan warning naming them."""
import pytest

from verl.compat.device.catalog import get_profile
from verl.compat.planning.planner import VLLM_ONLY_ROLLOUT_DEFAULTS, make_plan
from verl.compat.device.profile import SoftwareInfo
from verl.trainer.config_check import load_config

R = "actor_rollout_ref.rollout"
WITH_VLLM = SoftwareInfo(torch_version="2.11.0", triton_usable=True, vllm_version="0.11", vllm_usable=True,
                         rollout_engines=("hf", "vllm"))
CPU = SoftwareInfo(torch_version="2.11.0")


def _plan(overrides, device="cpu", software=CPU):
    return make_plan(get_profile(device), load_config(overrides, check=False), software, None)


def _vllm_warnings(plan):
    return [w for w in plan.warnings if "only apply to vLLM" in w]


def test_the_defaults_are_the_shipped_config_s():
    rollout = load_config([], check=False).actor_rollout_ref.rollout
    assert {key: rollout[key] for key in VLLM_ONLY_ROLLOUT_DEFAULTS} == VLLM_ONLY_ROLLOUT_DEFAULTS


def test_changed_vllm_keys_are_named_once_when_the_built_in_engine_runs():
    plan = _plan([f"{R}.max_num_seqs=64", f"{R}.enable_chunked_prefill=false"])
    assert plan.rollout.name == "hf"
    [warning] = _vllm_warnings(plan)
    assert f"{R}.max_num_seqs=64" in warning and f"{R}.enable_chunked_prefill=False" in warning
    assert "max_num_batched_tokens" not in warning


@pytest.mark.parametrize("overrides,device,software", [
    ([], "cpu", CPU),                                                          # nothing changed
    ([f"{R}.max_num_seqs=64", f"{R}.name=vllm", "trainer.n_gpus_per_node=1"], "h100", WITH_VLLM),  # vLLM reads them
])
def test_no_warning_when_nothing_is_ignored(overrides, device, software):
    assert _vllm_warnings(_plan(overrides, device, software)) == []
