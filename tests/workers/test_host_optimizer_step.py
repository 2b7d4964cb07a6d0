"""The offloaded role's optimizer step on the host: torch's fused CPU AdamW over FSDP2's host shards
(the plan's `fused_optimizer` for a param-offloaded role) steps exactly as the default AdamW does, and
the step runs with every host core even where the worker was given one thread."""
import os
import sys

import pytest
import torch
from omegaconf import OmegaConf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from worker_setup import cpu_plan, optim, tiny_model  # noqa: E402

from verl.utils import fsdp_utils  # noqa: E402
from verl.workers.fsdp_workers import _build_optimizer  # noqa: E402


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model(str(tmp_path_factory.mktemp("host_step_model")))


def _sharded(model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    return fsdp_utils.shard_model(model, param_dtype=torch.float32, compute_dtype=torch.float32,
                                  cast_params_for_compute=False, reduce_dtype=torch.float32, param_offload=False,
                                  device_type="cpu")


def test_fused_host_adamw_of_an_offloaded_plan_matches_the_default(model_dir):
    fsdp_utils.init_distributed("gloo")
    plan = cpu_plan(model_dir, device="p40", actor_rollout_ref__actor__fsdp_config__param_offload=True)
    # run on this host, the shards already live in host memory; the planned kernel is the offloaded one's
    assert "param offload" in plan.reasons["actor.fused_optimizer"] and plan.actor.fused_optimizer
    models = [_sharded(model_dir) for _ in range(2)]
    optimizers = [_build_optimizer(m, OmegaConf.create(optim(lr=1e-2)), fused=f)[0] for m, f in zip(models, (True, False))]
    assert optimizers[0].defaults["fused"] and not optimizers[1].defaults["fused"]
    ids = torch.tensor([[5, 17, 33, 2, 41, 9]])
    for _ in range(2):
        for model, opt in zip(models, optimizers):
            model(input_ids=ids, labels=ids).loss.backward()
            opt.step()
            opt.zero_grad()
    moved = 0
    for a, b, start in zip(models[0].parameters(), models[1].parameters(), _sharded(model_dir).parameters()):
        # one float32 kernel against torch's multi-tensor one: the same update, rounded in another order.
        # Where a gradient is as small as Adam's eps (1e-8) that rounding shows in the step's size, so the
        # bound is 1% of one step (lr 1e-2), far below the step itself
        torch.testing.assert_close(a.to_local(), b.to_local(), rtol=0, atol=1e-4)
        moved += not torch.equal(a.to_local(), start.to_local())
    assert moved > 0


@pytest.mark.skipif(fsdp_utils.host_cores() < 2, reason="one host core: nothing to widen")
def test_host_step_uses_every_core():
    param = torch.nn.Parameter(torch.ones(4))
    opt = torch.optim.AdamW([param], lr=0.1)
    fsdp_utils.step_on_all_host_cores(opt)
    seen = []
    opt.register_step_pre_hook(lambda o, a, k: seen.append(torch.get_num_threads()))
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        param.grad = torch.ones(4)
        opt.step()
        assert seen == [fsdp_utils.host_cores()] and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)
