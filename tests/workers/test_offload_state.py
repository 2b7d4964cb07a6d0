"""Where an offloaded model's tensors live through the PPO phases, over steps and a checkpoint resume.

What stands in for the GPU: the `meta` device. The models are sharded by the real `shard_model` for a
plan whose device is `meta`, so the offload really applies: FSDP2's CPUOffloadPolicy keeps shards
and gradients in host memory and steps them there, and optimizer state sent to "the device" really
lands on `meta`. `meta` is a second device type on which every op's same-device check fires (AdamW
raises "Expected all tensors to be on the same device ... meta and cpu" exactly as it raised
"cuda:0 and cpu" on the H200) and which holds no values (a checkpoint or a step taken from there
cannot match the reference numbers). What it cannot stand in for is compute: the FSDP2 mesh is the
gloo CPU mesh, so all-gathered (unsharded) parameters are computed on the CPU; and optimizer-only
offload (shards on the device) cannot run here at all; on a GPU `benchmarks/speed.py --rows p40_manual`
(every offload on) covers those.

The components are the workers' own (`_PlannedModel`, `_build_optimizer`, `_checkpoint_manager`, the
PPO actor/critic, the HF rollout engine under `full_params`) joined as the workers join them, for role
plans from the real planner's CPU plan with the offload flags set. Numbers: an offloaded run does the
same float32 CPU arithmetic as an unoffloaded one, so weights, values and log-probs agree to 1e-6.
"""
import os
import sys

import pytest
import torch
from torch.distributed.tensor import DTensor

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from worker_setup import (  # noqa: E402
    whole,
    PROMPT_LEN,
    actor_rollout_ref_config,
    cpu_plan,
    critic_config,
    ppo_batch,
    role_plan,
    tiny_model,
)

from verl.protocol import DataProto  # noqa: E402
from verl.utils import fsdp_utils  # noqa: E402
from verl.workers.model_building.loading import build_model  # noqa: E402
from verl.workers import fsdp_workers as fw  # noqa: E402
from verl.workers.actor.dp_actor import DataParallelPPOActor  # noqa: E402
from verl.workers.critic.dp_critic import DataParallelPPOCritic  # noqa: E402
from verl.workers.rollout import ENGINES  # noqa: E402

ACCELERATOR = torch.device("meta")
HOST = torch.device("cpu")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    fsdp_utils.init_distributed("gloo")
    return tiny_model(str(tmp_path_factory.mktemp("tiny_qwen2_offload")))


def _devices(tensors) -> set[str]:
    return {str(t.to_local().device if isinstance(t, DTensor) else t.device) for t in tensors}


def _state_tensors(optimizer) -> list[torch.Tensor]:
    return [v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor) and v.dim() > 0]


class _Role:
    """One trained model as a worker holds it: planned, sharded, with optimizer and checkpoint manager.

    Every optimizer step records where the shards, their gradients and the optimizer state are at
    that moment (before the step, and after it for the state the first step creates)."""

    def __init__(self, name, model_dir, plan, device_type, config, records, value_head=False):
        torch.manual_seed(0)
        self.planned = fw._PlannedModel(name, getattr(plan, name), device_type)
        module = build_model(model_dir, self.planned.role_plan, value_head=value_head, train=True)
        self.module = self.planned.shard(module)
        self.optimizer, self.scheduler = fw._build_optimizer(self.module, config.optim)
        # Model and optimizer shards: the offloaded state. (The extra state holds the device's RNG, which
        # `meta` has not; the LR schedule is constant here.)
        self.checkpoint = fw._checkpoint_manager(self.planned, self.module, self.optimizer, self.scheduler, None,
                                                 {"save_contents": ["model", "optimizer"]})
        self.at_step = records
        self.device = ACCELERATOR if device_type == "meta" else HOST
        self.planned.place_optimizer(self.optimizer, self.device)   # as the worker does, before the records
        self.optimizer.register_step_pre_hook(self._record("before"))
        self.optimizer.register_step_post_hook(self._record("after"))

    def _record(self, when):
        def hook(optimizer, args, kwargs):
            params = [p for g in optimizer.param_groups for p in g["params"]]
            self.at_step.append({"when": when, "shards": _devices(params),
                                 "grads": _devices(p.grad for p in params if p.grad is not None),
                                 "state": _devices(_state_tensors(optimizer))})
        return hook

    def update(self, fn, data):
        """The worker's update: PPO epochs (the optimizer state placed per the plan at each step), then the LR."""
        metrics = fn(data)
        self.scheduler.step()
        return metrics

    def placement(self) -> dict:
        return {"shards": _devices(self.module.parameters()), "state": _devices(_state_tensors(self.optimizer))}


def _run(model_dir, tmp_path, device_type, param_offload, optimizer_offload, steps=2, resume_steps=1):
    """Generate, log-prob (actor and ref), values, critic and actor updates for `steps` steps; save; load
    into freshly built models; `resume_steps` more steps. Returns placements after each phase and numbers."""
    offload = dict(param_offload=param_offload, optimizer_offload=optimizer_offload)
    plan = cpu_plan(model_dir, actor=role_plan(**offload), critic=role_plan(**offload))
    plan.ref = role_plan(param_offload=param_offload)
    arr = fw._copy_config(actor_rollout_ref_config(model_dir, use_kl_loss=True))
    arr.actor.ppo_mini_batch_size = 4  # per rank, in sequences, as the worker normalises it
    ccfg = fw._copy_config(critic_config(model_dir))
    ccfg.ppo_mini_batch_size = 4

    records = {"actor": [], "critic": []}  # every optimizer step of both builds (before and after the resume)

    def build():
        actor = _Role("actor", model_dir, plan, device_type, arr.actor, records["actor"])
        critic = _Role("critic", model_dir, plan, device_type, ccfg, records["critic"], value_head=True)
        actor.ppo = DataParallelPPOActor(arr.actor, actor.module, actor.optimizer, precision=actor.planned.precision)
        critic.ppo = DataParallelPPOCritic(ccfg, critic.module, critic.optimizer, precision=critic.planned.precision)
        return actor, critic

    actor, critic = build()
    ref_planned = fw._PlannedModel("ref", plan.ref, device_type)
    ref_module = ref_planned.shard(build_model(model_dir, plan.ref, train=False))
    ref = DataParallelPPOActor(arr.ref, ref_module, precision=ref_planned.precision)
    rollout = ENGINES["hf"](actor.module, arr.rollout, plan=plan)

    trace, numbers = [], {"values": [], "ref_log_prob": [], "log_prob": [], "responses": []}
    for step in range(steps + resume_steps):
        if step == steps:
            path = str(tmp_path / f"{device_type}_{param_offload}_{optimizer_offload}" / "global_step_2")
            actor.checkpoint.save_checkpoint(os.path.join(path, "actor"), global_step=steps)
            critic.checkpoint.save_checkpoint(os.path.join(path, "critic"), global_step=steps)
            saved_state = [t.clone() for t in _state_tensors(critic.optimizer)]
            actor, critic = build()
            rollout = ENGINES["hf"](actor.module, arr.rollout, plan=plan)
            actor.checkpoint.load_checkpoint(os.path.join(path, "actor"))
            critic.checkpoint.load_checkpoint(os.path.join(path, "critic"))
            trace.append(("loaded", "critic", critic.placement()))
            trace.append(("loaded", "actor", actor.placement()))
            loaded = _state_tensors(critic.optimizer)
            assert len(loaded) == len(saved_state) > 0
            assert all(torch.equal(a.to_local() if isinstance(a, DTensor) else a,
                                   b.to_local() if isinstance(b, DTensor) else b) for a, b in zip(loaded, saved_state))
        data = ppo_batch(batch_size=4, seed=step)
        prompts = DataProto.from_dict({k: data.batch[k][:, :PROMPT_LEN]
                                       for k in ("input_ids", "attention_mask", "position_ids")},
                                      meta_info={"eos_token_id": 1, "pad_token_id": 0, "seed": step})
        with torch.no_grad(), fsdp_utils.full_params(actor.module):
            gathered = list(actor.module.parameters())
            assert not any(isinstance(p, DTensor) for p in gathered)  # whole weights, on the compute device
            numbers["responses"].append(rollout.generate_sequences(prompts).batch["responses"])
        trace.append(("generate", "actor", actor.placement()))
        meta = {"micro_batch_size": 2, "max_token_len": 64, "use_dynamic_bsz": False, "temperature": 1.0}
        data.meta_info.update(meta)
        log_prob, _ = actor.ppo.compute_log_prob(data, calculate_entropy=False)
        data.batch["old_log_probs"] = log_prob
        data.batch["ref_log_prob"], _ = ref.compute_log_prob(data, calculate_entropy=False)
        trace.append(("log_prob", "actor", actor.placement()))
        data.batch["values"] = critic.ppo.compute_values(data)
        trace.append(("values", "critic", critic.placement()))
        critic.update(critic.ppo.update_critic, data)
        trace.append(("update", "critic", critic.placement()))
        actor.update(actor.ppo.update_policy, data)
        trace.append(("update", "actor", actor.placement()))
        for key in ("values", "ref_log_prob"):
            numbers[key].append(data.batch[key])
        numbers["log_prob"].append(log_prob)
    weights = {name: [whole(p).detach().clone() for p in role.module.parameters()]
               for name, role in (("actor", actor), ("critic", critic))}
    ref_devices = _devices(ref_module.parameters())
    return trace, numbers, weights, records, ref_devices


@pytest.fixture(scope="module")
def reference(model_dir, tmp_path_factory):
    """The same run with nothing offloaded."""
    return _run(model_dir, tmp_path_factory.mktemp("ref"), "cpu", False, False)


@pytest.mark.parametrize("optimizer_offload", [True, False], ids=["params+optimizer", "params"])
def test_param_offload_keeps_shards_grads_and_state_in_host_memory(model_dir, tmp_path, reference,
                                                                  optimizer_offload):
    trace, numbers, weights, steps, ref_devices = _run(model_dir, tmp_path, "meta", True, optimizer_offload)

    # Between phases: shards in host memory; optimizer state there too (never on the accelerator).
    for phase, role, where in trace:
        assert where["shards"] == {"cpu"}, (phase, role, where)
        assert where["state"] <= {"cpu"}, (phase, role, where)
    assert ref_devices == {"cpu"}
    # At every step: the step runs where FSDP2 keeps the shards and gradients, with the state beside them;
    # the state the first step creates lazily is made there too.
    for role, records in steps.items():
        assert len(records) == 2 * 3, role  # before/after x 3 steps (2, then 1 after the resume)
        for r in records:
            assert r["shards"] == {"cpu"} and r["grads"] <= {"cpu"}, (role, r)
            assert r["state"] == ({"cpu"} if r["when"] == "after" or r is not records[0] else set()), (role, r)

    # The same arithmetic as the unoffloaded run, through the save/load.
    _, ref_numbers, ref_weights, _, _ = reference
    for key, values in numbers.items():
        for got, want in zip(values, ref_numbers[key]):
            torch.testing.assert_close(got, want, rtol=0, atol=1e-6, msg=key)
    for name in weights:
        for got, want in zip(weights[name], ref_weights[name]):
            torch.testing.assert_close(got, want, rtol=0, atol=1e-6, msg=name)


def test_offload_leaves_the_state_of_host_shards_in_host_memory():
    """Optimizer offload moves the state to the step's device (`meta` here: the move would be real, and
    AdamW would refuse meta state for a host shard) except the state of shards held in host memory, which
    is where their step runs; after every step the state is in host memory."""
    param = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.AdamW([param], lr=0.1)
    fsdp_utils.offload_optimizer_state(optimizer, ACCELERATOR)
    at_step = []
    optimizer.register_step_pre_hook(lambda opt, *_: at_step.append(_devices(_state_tensors(opt))))
    for _ in range(2):
        param.grad = torch.ones(3)
        optimizer.step()
        assert _devices(_state_tensors(optimizer)) == {"cpu"}
    assert at_step == [set(), {"cpu"}]    # none before the first step creates it
