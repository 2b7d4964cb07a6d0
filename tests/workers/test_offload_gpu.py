"""On a CUDA device: optimizer offload keeps AdamW's state in host memory except for each step.

The CPU tests (test_offload_state.py, test_plan_contract.py) record where each state move sends the
state; this one runs the real move on a GPU, with FSDP2 on one rank and the fused AdamW the plan picks
where parameters stay on the device, and checks the weights against the same run without offload.
Runs without conftest (`pytest --noconftest`), so a bare GPU image needs only torch.
"""
import os
import socket

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import fully_shard

from verl.utils.fsdp_utils import offload_optimizer_state

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


@pytest.fixture(scope="module")
def one_rank():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("cpu:gloo,cuda:nccl", rank=0, world_size=1)
    torch.cuda.set_device(0)
    yield
    dist.destroy_process_group()


def _train(offload: bool, fused: bool) -> tuple[list[torch.Tensor], list[set]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64)).cuda()
    for layer in (model[0], model[2]):
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=fused)
    if offload:
        offload_optimizer_state(opt, "cuda")
    seen_in_forward = []

    def state_devices(*_):
        seen_in_forward.append({v.device.type for s in opt.state.values() for v in s.values()
                                if isinstance(v, torch.Tensor) and v.dim() > 0})

    model.register_forward_pre_hook(state_devices)
    data = torch.randn(8, 64, device="cuda", generator=torch.Generator("cuda").manual_seed(1))
    host_buffers = []
    for _ in range(3):
        model(data).pow(2).mean().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if offload:
            local = [v.to_local() for s in opt.state.values() for v in s.values()
                     if isinstance(v, torch.Tensor) and v.dim() > 0]
            assert {t.device.type for t in local} == {"cpu"}
            assert all(t.is_pinned() for t in local)   # page-locked: DMA copies, no staging
            host_buffers.append([t.data_ptr() for t in local])
    if offload:   # the same buffers every step (made once, not per step)
        assert host_buffers[0] == host_buffers[1] == host_buffers[2]
    return [p.full_tensor().detach().cpu() for p in model.parameters()], seen_in_forward


@pytest.mark.parametrize("fused", [True, False])
def test_state_is_on_the_gpu_only_for_the_step_and_the_update_is_unchanged(one_rank, fused):
    weights, seen = _train(offload=True, fused=fused)
    reference, _ = _train(offload=False, fused=fused)
    assert seen[0] == set() and all(s == {"cpu"} for s in seen[1:]), seen   # no state before step 1
    for w, r in zip(weights, reference):
        torch.testing.assert_close(w, r, rtol=0, atol=0)
