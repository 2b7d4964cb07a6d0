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


def test_frozen_layers_compile_once_for_every_layer():
    """Every upcast layer shares one forward (its class's), so a compiled decoder layer is one graph for all
    layers: a per-module forward object would be guarded by identity and recompile for each layer, until
    dynamo's recompile limit turns compiling off (seen on the H200 with the 36-layer reference model)."""
    import torch._dynamo

    layers = [torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Embedding(4, 8)).half().requires_grad_(False)
              for _ in range(4)]
    assert all(frozen_weights.upcast_frozen(layer) == 2 for layer in layers)
    assert not any("forward" in m.__dict__ for layer in layers for m in layer.modules())
    torch._dynamo.reset()
    frames = []

    def count(gm, _inputs):
        frames.append(gm)
        return gm.forward

    run = torch.compile(lambda layer, x: layer[0](x), backend=count, dynamic=False)
    x = torch.randn(2, 8)
    outs = [run(layer, x) for layer in layers]
    assert len(frames) == 1
    for layer, out in zip(layers, outs):
        torch.testing.assert_close(out, x @ layer[0].weight.float().T + layer[0].bias.float())


def test_float16_reference_wrapped_in_fsdp2_computes_in_float32(model_dir):
    """Offloaded (FSDP2-wrapped), a float16-stored reference on a float32 device still computes in float32:
    FSDP2 must cast every layer's float16 weights up as it gathers them, even though the model then holds
    one storage dtype only."""
    worker = ActorRolloutRefWorker(
        actor_rollout_ref_config(model_dir, use_kl_loss=True), role="ref",
        plan=cpu_plan(model_dir, device="p40", actor_rollout_ref__ref__fsdp_config__param_offload=True))
    worker.init_model()
    assert worker.plan.ref.fsdp and worker.plan.ref.frozen_dtype == "float16"
    seen = []
    layer = worker.ref_module.model.layers[0]
    hook = layer.mlp.down_proj.register_forward_hook(lambda m, i, o: seen.append((m.weight.dtype, o.dtype)))
    data = ppo_batch(batch_size=4)
    got = worker.compute_ref_log_prob(data).batch["ref_log_prob"]
    hook.remove()
    assert seen and set(seen) == {(torch.float32, torch.float32)}
    want = _ref(model_dir, "cpu").compute_ref_log_prob(data).batch["ref_log_prob"]
    torch.testing.assert_close(got, want, rtol=0, atol=2e-3)
