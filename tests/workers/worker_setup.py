"""Shared setup for the worker tests: a CPU plan, upstream-shaped configs and a synthetic PPO batch.

Also imported by `dist_runner.py`, which the two-process test launches as separate Python processes.
"""
from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys

import torch
from omegaconf import OmegaConf

from verl.compat.plan import Plan, RolePlan
from verl.protocol import DataProto

PROMPT_LEN, RESPONSE_LEN = 8, 6


def whole(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor: a DTensor's (FSDP2-wrapped model), else `t` itself (the one-device plan runs
    models unwrapped, verl.compat.planning.wrapping)."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def tiny_model(out_dir: str) -> str:
    from verl.utils.tiny_model import build_tiny_model_dir

    return build_tiny_model_dir(out_dir, hidden_size=32, num_layers=2, intermediate_size=64, num_heads=4,
                                num_kv_heads=2, seed=0)


def role_plan(**overrides) -> RolePlan:
    base = RolePlan(param_dtype="float32", compute_dtype="float32", grad_scaler=False, attn_implementation="sdpa",
                    use_remove_padding=False, gradient_checkpointing=False, param_offload=False,
                    optimizer_offload=False, micro_batch_size_per_gpu=2, max_token_len_per_gpu=64)
    return dataclasses.replace(base, **overrides)


def cpu_plan(model_dir: str, actor: RolePlan | None = None, critic: RolePlan | None = None, *,
             device: str = "cpu", **overrides) -> Plan:
    """What `verl.compat.planning.planner.make_plan` decides for these configs on `device` (a catalog name; a
    GPU plan is run on the host CPU through `verl.compat.apply.apply_plan.on_host_cpu`, its dtypes unchanged),
    optionally with the actor/critic role plans swapped for a test. `overrides` set config keys, with
    `__` for dots: `compat__numerics_guard=False`."""
    from verl.compat.apply.apply_plan import on_host_cpu
    from verl.compat.device.detect import detect_profile, detect_software
    from verl.compat.planning.model_spec import ModelSpec
    from verl.compat.planning.planner import make_plan

    profile = detect_profile(device)
    config = OmegaConf.create({
        "actor_rollout_ref": actor_rollout_ref_config(model_dir, use_kl_loss=True),
        "critic": critic_config(model_dir),
        "data": {"max_prompt_length": PROMPT_LEN, "max_response_length": RESPONSE_LEN, "train_batch_size": 4},
        # the ranks this process runs among (the runners of the multi-process tests set WORLD_SIZE): a plan
        # for one device runs models unwrapped, which the worker refuses at more ranks
        "trainer": {"n_gpus_per_node": int(os.environ.get("WORLD_SIZE", 1)), "nnodes": 1},
        "algorithm": {"adv_estimator": "gae"},
    })
    for key, value in overrides.items():
        OmegaConf.update(config, key.replace("__", "."), value, force_add=True)
    plan = on_host_cpu(make_plan(profile, config, detect_software(profile), ModelSpec.from_pretrained(model_dir)))
    assert plan.device_type == "cpu" and plan.dist_backend == "gloo" and plan.rollout.name == "hf"
    if actor is not None:
        plan.actor = actor
    if critic is not None:
        plan.critic = critic
    return plan


def optim(lr: float = 1e-3) -> dict:
    return {"lr": lr, "lr_warmup_steps_ratio": 0.0, "total_training_steps": 10, "weight_decay": 0.0,
            "lr_warmup_steps": -1, "betas": [0.9, 0.999], "min_lr_ratio": 0.0, "num_cycles": 0.5,
            "lr_scheduler_type": "constant", "warmup_style": None}


def actor_rollout_ref_config(path: str, **actor_overrides):
    """The `actor_rollout_ref` subtree with upstream's key names, CPU-sized."""
    actor = {
        "strategy": "fsdp", "ppo_mini_batch_size": 2, "ppo_micro_batch_size": None, "ppo_micro_batch_size_per_gpu": 2,
        "use_dynamic_bsz": False, "ppo_max_token_len_per_gpu": 64, "clip_ratio": 0.2, "clip_ratio_low": 0.2,
        "clip_ratio_high": 0.2, "clip_ratio_c": 3.0, "policy_loss": {"loss_mode": "vanilla"},
        "loss_agg_mode": "token-mean", "loss_scale_factor": None, "entropy_coeff": 0.0, "calculate_entropy": False,
        "use_kl_loss": False, "kl_loss_coef": 0.001, "kl_loss_type": "low_var_kl", "ppo_epochs": 1,
        "shuffle": False, "data_loader_seed": 42, "grad_clip": 1.0, "optim": optim(),
    }
    actor.update(actor_overrides)
    return OmegaConf.create({
        "model": {"path": path, "trust_remote_code": False, "override_config": {}, "use_remove_padding": False},
        "actor": actor,
        "ref": {"log_prob_micro_batch_size": None, "log_prob_micro_batch_size_per_gpu": 2,
                "log_prob_use_dynamic_bsz": False, "log_prob_max_token_len_per_gpu": 64},
        "rollout": {"name": "hf", "n": 2, "temperature": 1.0, "top_k": -1, "top_p": 1.0, "do_sample": True,
                    "prompt_length": PROMPT_LEN, "response_length": RESPONSE_LEN,
                    "log_prob_micro_batch_size": None, "log_prob_micro_batch_size_per_gpu": 2,
                    "log_prob_use_dynamic_bsz": False, "log_prob_max_token_len_per_gpu": 64,
                    "val_kwargs": {"top_k": -1, "top_p": 1.0, "temperature": 0, "n": 1, "do_sample": False}},
    })


def critic_config(path: str, **overrides):
    critic = {
        "strategy": "fsdp", "rollout_n": 2, "ppo_mini_batch_size": 2, "ppo_micro_batch_size": None,
        "ppo_micro_batch_size_per_gpu": 2, "forward_micro_batch_size": None, "forward_micro_batch_size_per_gpu": 2,
        "use_dynamic_bsz": False, "ppo_max_token_len_per_gpu": 64, "forward_max_token_len_per_gpu": 64,
        "ppo_epochs": 1, "shuffle": False, "cliprange_value": 0.5, "loss_agg_mode": "token-mean",
        "loss_scale_factor": None, "grad_clip": 1.0, "optim": optim(lr=1e-2),
        "model": {"path": path, "trust_remote_code": False, "override_config": {}},
    }
    critic.update(overrides)
    return OmegaConf.create(critic)


def ppo_batch(batch_size: int = 8, vocab: int = 60, seed: int = 0) -> DataProto:
    """Left-padded prompts and right-padded responses of varied lengths, with advantages and returns."""
    g = torch.Generator().manual_seed(seed)
    total = PROMPT_LEN + RESPONSE_LEN
    input_ids = torch.randint(3, vocab, (batch_size, total), generator=g)
    attention_mask = torch.ones(batch_size, total, dtype=torch.long)
    for i in range(batch_size):
        attention_mask[i, : i % 4] = 0                                   # left padding of the prompt
        response_pad = (i * 3) % RESPONSE_LEN                             # right padding after EOS
        if response_pad:
            attention_mask[i, total - response_pad :] = 0
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    responses = input_ids[:, PROMPT_LEN:]
    response_mask = attention_mask[:, PROMPT_LEN:]
    return DataProto.from_dict(
        tensors={
            "input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids,
            "responses": responses, "response_mask": response_mask,
            "advantages": torch.randn(batch_size, RESPONSE_LEN, generator=g) * response_mask,
            "returns": torch.randn(batch_size, RESPONSE_LEN, generator=g) * response_mask,
        },
        meta_info={"temperature": 1.0},
    )


REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def close_process_group() -> None:
    """End a rank script: a gloo group still open at interpreter exit can abort the process
    ("terminate called without an active exception"), which run_ranks reports as a failed rank."""
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def run_ranks(argv_for_rank, world: int, timeout: float = 240) -> None:
    """Run `argv_for_rank(rank)` as one process per gloo rank (RANK/WORLD_SIZE/MASTER_* set, the repo
    on PYTHONPATH). A rank that exits non-zero fails the test with its log; one that outlives
    `timeout` kills every rank, so a collective that hangs cannot eat the CI budget."""
    import pytest

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world),
                   LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1", MASTER_PORT=port, OMP_NUM_THREADS="1",
                   PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))
        procs.append(subprocess.Popen([sys.executable, *argv_for_rank(rank)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    for proc in procs:
        try:
            log, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            pytest.fail(f"a rank did not finish within {timeout:.0f} s")
        assert proc.returncode == 0, log.decode()[-3000:]


class GradRecorder:
    """Stands in for the optimizer: records the accumulated (full) gradients at each step."""

    def __init__(self, params):
        self.params = list(params)
        self.grads = []

    def step(self):
        self.grads.append([whole(p.grad).clone() for p in self.params])

    def zero_grad(self, set_to_none=True):
        for p in self.params:
            p.grad = None
