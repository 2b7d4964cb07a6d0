"""A reference model stored in float16 on a float32-compute device (the p40 plan's `ref.frozen_dtype`)
computes in float32, one layer's weights at a time, and matches the float32 reference within float16's
rounding of the weights (2e-3 on log-probs of the tiny model, whose logits are O(1))."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from worker_setup import actor_rollout_ref_config, cpu_plan, ppo_batch, tiny_model  # noqa: E402

from verl.workers.model_building import frozen_weights  # noqa: E402
from verl.workers.fsdp_workers import ActorRolloutRefWorker  # noqa: E402


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model(str(tmp_path_factory.mktemp("frozen_model")))


def _ref(model_dir, device):
    worker = ActorRolloutRefWorker(actor_rollout_ref_config(model_dir, use_kl_loss=True), role="ref",
                                   plan=cpu_plan(model_dir, device=device))
    worker.init_model()
    return worker


def test_float16_reference_on_a_float32_device_matches_float32(model_dir):
    half, full = _ref(model_dir, "p40"), _ref(model_dir, "cpu")
    assert half.plan.ref.compute_dtype == "float32" and half.plan.ref.frozen_dtype == "float16"
    assert {p.dtype for p in half.ref_module.parameters()} == {torch.float16}
    assert frozen_weights.compute_dtype_of(half.ref_module) == torch.float32
    data = ppo_batch(batch_size=4)
    got = half.compute_ref_log_prob(data).batch["ref_log_prob"]
    want = full.compute_ref_log_prob(data).batch["ref_log_prob"]
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=0, atol=2e-3)
    assert not torch.equal(got, want)   # really computed from the float16-rounded weights


def test_upcast_linear_gives_float32_gradients_from_float16_weights():
    """Backward through a frozen float16 layer (a LoRA base) gives the float32 layer's input gradient."""
    torch.manual_seed(0)
    layer = torch.nn.Linear(16, 8).requires_grad_(False)
    half = torch.nn.Linear(16, 8).requires_grad_(False)
    half.load_state_dict(layer.state_dict())
    half.half()
    wrapper = torch.nn.Sequential(half)
    assert frozen_weights.upcast_frozen(wrapper) == 1
    x = torch.randn(4, 16, requires_grad=True)
    x16 = x.detach().clone().requires_grad_(True)
    layer(x).sum().backward()
    out = wrapper(x16)
    out.sum().backward()
    assert out.dtype == torch.float32 and x16.grad.dtype == torch.float32
    torch.testing.assert_close(x16.grad, x.grad, rtol=0, atol=2e-3)
    with torch.autocast("cpu", dtype=torch.bfloat16):   # under autocast the layer runs as autocast says
        assert wrapper(x16).dtype == torch.bfloat16
