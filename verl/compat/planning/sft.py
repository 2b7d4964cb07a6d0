"""The compat plan of an SFT run (`verl.trainer.sft_trainer`): the model is planned as the actor of a
policy-gradient run with the same rules (dtype, attention, offload, checkpointing, micro-batches).

SFT's keys (upstream 0.9.1's `sft_trainer_engine.yaml`: `model.*`, `engine.*`, `data.*`, `trainer.*`)
are read into the actor's places of the PPO key tree (LoRA's `model.lora_rank` / `lora_alpha` /
`target_modules` too, so the same LoRA rules plan the frozen base and its adapters); its one pass per batch is a mini-batch of
`data.train_batch_size` sequences of up to `data.max_length` tokens, all of them scored (a one-token
prompt and a response of the rest, as the memory model sees it); nothing is generated, so the plan has no
rollout or validation phase and no engine settings.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from verl.compat.planning import settings
from verl.compat.planning.planner import GENERATES_KEY
from verl.compat.plan import Plan

# SFT key -> the actor's key in the PPO tree the planner reads
_KEYS = {
    "model.path": "actor_rollout_ref.model.path",
    "model.attn_implementation": "actor_rollout_ref.model.attn_implementation",
    "model.override_config.attn_implementation": "actor_rollout_ref.model.override_config.attn_implementation",
    "model.enable_gradient_checkpointing": "actor_rollout_ref.model.enable_gradient_checkpointing",
    "model.lora_rank": "actor_rollout_ref.model.lora_rank",
    "model.lora_alpha": "actor_rollout_ref.model.lora_alpha",
    "model.target_modules": "actor_rollout_ref.model.target_modules",
    "model.exclude_modules": "actor_rollout_ref.model.exclude_modules",
    "model.lora_adapter_path": "actor_rollout_ref.model.lora_adapter_path",
    "model.use_liger": "actor_rollout_ref.model.use_liger",
    "model.use_fused_kernels": "actor_rollout_ref.model.use_fused_kernels",
    "engine.dtype": "actor_rollout_ref.actor.fsdp_config.dtype",
    "engine.model_dtype": "actor_rollout_ref.actor.fsdp_config.model_dtype",
    "engine.param_offload": "actor_rollout_ref.actor.fsdp_config.param_offload",
    "engine.optimizer_offload": "actor_rollout_ref.actor.fsdp_config.optimizer_offload",
    "engine.reshard_after_forward": "actor_rollout_ref.actor.fsdp_config.reshard_after_forward",
    "engine.use_torch_compile": "actor_rollout_ref.actor.use_torch_compile",
    "engine.ulysses_sequence_parallel_size": "actor_rollout_ref.actor.ulysses_sequence_parallel_size",
    "data.micro_batch_size_per_gpu": "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
    "data.use_dynamic_bsz": "actor_rollout_ref.actor.use_dynamic_bsz",
    "data.max_token_len_per_gpu": "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
    "trainer.n_gpus_per_node": "trainer.n_gpus_per_node",
    "trainer.nnodes": "trainer.nnodes",
    "compat.device": "compat.device",
    "compat.strict": "compat.strict",
    "compat.numerics_guard": "compat.numerics_guard",
    "compat.memory_margin": "compat.memory_margin",
    "compat.always_fsdp": "compat.always_fsdp",
    "compat.compile_cache_dir": "compat.compile_cache_dir",
}


def _put(tree: dict, path: str, value: Any) -> None:
    *parents, leaf = path.split(".")
    for key in parents:
        tree = tree.setdefault(key, {})
    tree[leaf] = value


def ppo_view(config: Any) -> dict:
    """The SFT config as the PPO key tree the planner reads: the model as a GRPO actor without a
    reference model, `data.max_length` tokens per sequence, one mini-batch per training batch."""
    batch = int(settings.get(config, "data.train_batch_size", 256))
    view: dict = {}
    for sft_key, ppo_key in _KEYS.items():
        value = settings.raw(config, sft_key)
        if value is not None:
            _put(view, ppo_key, value)
    # SFT's loss reads the logits of every position, so the sequence is planned as a one-token prompt and a
    # response of the rest: the update's logits, log-prob chunks and their gradients then cover every token
    length = int(settings.get(config, "data.max_length", 1024))
    for key, value in {"data.max_prompt_length": 1, "data.max_response_length": max(length - 1, 1), "data.train_batch_size": batch,
                       "actor_rollout_ref.actor.ppo_mini_batch_size": batch, "actor_rollout_ref.rollout.n": 1,
                       "actor_rollout_ref.rollout.name": "hf", "algorithm.adv_estimator": "grpo",
                       "critic.enable": False, GENERATES_KEY: False}.items():
        _put(view, key, value)
    return view


def make_sft_plan(profile, config: Any, software, model=None) -> Plan:
    """The plan for an SFT run (pure, as `make_plan`); the actor role is the trained model."""
    from verl.compat.planning.planner import make_plan

    return _padded(make_plan(profile, ppo_view(config), software, model))


def build_sft_plan(config: Any, *, to_run: bool = True) -> Plan:
    """Driver side, as `verl.compat.build_plan`: the device, the software and the model's config.json."""
    from verl import compat

    return _padded(compat.build_plan(ppo_view(config), to_run=to_run))


def _padded(plan: Plan) -> Plan:
    """SFT micro-batches are padded to their longest row (no packed sequences): packing is planned off."""
    if not plan.actor.use_remove_padding:
        return plan
    plan.reasons["actor.use_remove_padding"] = "SFT micro-batches are padded to their longest row"
    return replace(plan, actor=replace(plan.actor, use_remove_padding=False))
