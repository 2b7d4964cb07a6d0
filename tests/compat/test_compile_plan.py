"""compat.compile_warmup and compat.compile_cache_dir: the plan's choice per case, each with its reason.

synchronous wherever compiled code is planned (the default: compiled code from the first step on);
background when the user asks and the eager first steps fit, refused (adapted, or an error under compat.strict)
for Ulysses and where the eager steps would not fit; off where nothing is compiled. The cache folder is
per torch version and device unless the user names one.
"""
import dataclasses
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from test_planner import PLAIN, QUICKSTART, QWEN05, config  # noqa: E402

from verl.compat.device.catalog import get_profile  # noqa: E402
from verl.compat.planning.compile import default_cache_dir  # noqa: E402
from verl.compat.planning.planner import PlanError, make_plan  # noqa: E402
from verl.compat.planning.sft import make_sft_plan  # noqa: E402

GRPO = config(64, 512, 512, 16, 16, 16, algorithm__adv_estimator="grpo", actor_rollout_ref__rollout__n=4,
              actor_rollout_ref__actor__use_kl_loss=True)


def _plan(cfg, device="h200", software=PLAIN, **extra):
    cfg = {**cfg, "compat": {**cfg["compat"], **extra}}
    return make_plan(get_profile(device), cfg, software, QWEN05)


@pytest.mark.parametrize("cfg", [GRPO, QUICKSTART], ids=["grpo", "quickstart"])
def test_synchronous_by_default_background_when_asked_and_the_eager_steps_fit(cfg):
    plan = _plan(cfg)
    assert plan.torch_compile and plan.compile_warmup == "synchronous"
    assert plan.reasons["compile_warmup"].startswith("compiled before the first step")
    asked = _plan(cfg, compile_warmup="background")
    assert asked.compile_warmup == "background" and not asked.warnings
    assert asked.reasons["compile_warmup"].startswith("set by the user") and "side thread" in asked.reasons["compile_warmup"]


def test_background_refused_where_the_eager_first_steps_would_not_fit():
    """On a T4 the fitted GRPO plan fits only with compiled layers (they keep less for backward)."""
    assert _plan(GRPO, "t4").compile_warmup == "synchronous"
    strict = {**GRPO["compat"], "strict": True, "compile_warmup": "background"}
    with pytest.raises(PlanError, match="compile_warmup=background"):
        make_plan(get_profile("t4"), {**GRPO, "compat": strict}, PLAIN, QWEN05)
    asked = _plan(GRPO, "t4", compile_warmup="background")   # not strict: adapted, with a warning
    assert asked.compile_warmup == "synchronous" and any("compile_warmup" in w for w in asked.warnings)
    assert "eager first steps would need" in asked.reasons["compile_warmup"]


def test_background_refused_for_ulysses():
    cfg = config(64, 512, 512, 16, 16, 16, actor_rollout_ref__actor__ulysses_sequence_parallel_size=2,
                 trainer__n_gpus_per_node=2)
    plan = _plan(cfg, compile_warmup="background")
    assert plan.actor.sequence_parallel_size == 2 and plan.compile_warmup == "synchronous"
    assert "Ulysses" in plan.reasons["compile_warmup"]


def test_the_user_asks():
    assert _plan(GRPO, compile_warmup="synchronous").compile_warmup == "synchronous"
    assert _plan(GRPO, compile_warmup="background").reasons["compile_warmup"].startswith("set by the user")
    off = _plan(GRPO, compile_warmup="off")
    assert (off.torch_compile, off.compile_warmup, off.compile_cache_dir) == (False, "off", None)
    assert off.reasons["torch_compile"] == "compat.compile_warmup=off"
    forced = config(64, 512, 512, 16, 16, 16, actor_rollout_ref__actor__use_torch_compile=True)
    kept = _plan(forced, compile_warmup="off")   # use_torch_compile=true wins, compiled before the first step
    assert kept.torch_compile and kept.compile_warmup == "synchronous" and kept.warnings


@pytest.mark.parametrize("device, software", [("p40", PLAIN), ("h200", dataclasses.replace(PLAIN, triton_usable=False))])
def test_off_where_nothing_is_compiled(device, software):
    plan = _plan(GRPO, device, software)
    assert not plan.torch_compile and plan.compile_warmup == "off" and plan.compile_cache_dir is None


def test_sft_compiles_before_its_first_step():
    sft = {"model": {"path": "unused"}, "data": {"train_batch_size": 32, "max_length": 1024,
                                                 "micro_batch_size_per_gpu": 4},
           "trainer": {"n_gpus_per_node": 1, "nnodes": 1}, "compat": {"strict": False, "memory_margin": 0.1}}
    plan = make_sft_plan(get_profile("h200"), sft, PLAIN, QWEN05)
    assert plan.torch_compile and plan.compile_warmup == "synchronous"
    assert plan.reasons["compile_warmup"].startswith("compiled before the first step")


def test_cache_folder_per_torch_version_and_device():
    plan = _plan(GRPO)
    assert plan.compile_cache_dir == "~/.cache/verl/compile/torch-2.11.0-h200" == default_cache_dir("2.11.0", "h200")
    assert default_cache_dir("2.11.0+cu128", "NVIDIA H200 NVL") == "~/.cache/verl/compile/torch-2.11.0+cu128-nvidia-h200-nvl"
    assert _plan(GRPO, compile_cache_dir="/data/cc").compile_cache_dir == "/data/cc"
    assert _plan(GRPO, compile_cache_dir="/data/cc").reasons["compile_cache_dir"] == "set by the user"


def test_workers_point_inductor_at_the_planned_folder(tmp_path, monkeypatch):
    from verl.compat.apply.apply_plan import INDUCTOR_CACHE_ENV, use_compile_cache

    for name in (INDUCTOR_CACHE_ENV, "TORCHINDUCTOR_FX_GRAPH_CACHE", "TORCHINDUCTOR_AUTOGRAD_CACHE"):
        monkeypatch.delenv(name, raising=False)   # restored as they were after the test
    monkeypatch.setenv("HOME", str(tmp_path))
    folder = use_compile_cache("~/.cache/verl/compile/torch-2.11.0-h200")
    assert folder == os.environ[INDUCTOR_CACHE_ENV] == str(tmp_path / ".cache/verl/compile/torch-2.11.0-h200")
    assert os.path.isdir(folder) and os.environ["TORCHINDUCTOR_FX_GRAPH_CACHE"] == "1"
    monkeypatch.setenv(INDUCTOR_CACHE_ENV, "/mine")   # a folder the user set is kept
    assert use_compile_cache(str(tmp_path / "other")) == "/mine" and not (tmp_path / "other").exists()
