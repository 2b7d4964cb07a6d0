"""The plan's throughput rules (verl/compat/planning/throughput.py) through the real planner and config."""
import pytest

from verl.compat.__main__ import plan_for

# upstream's quick-start shape: batch 256, 512 + 512 tokens, explicit micro-batch 4
QUICKSTART = ["data.train_batch_size=256", "data.max_prompt_length=512", "data.max_response_length=512",
              "actor_rollout_ref.actor.ppo_mini_batch_size=64", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
              "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
              "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4", "critic.ppo_micro_batch_size_per_gpu=4",
              "algorithm.use_kl_in_reward=true", "trainer.n_gpus_per_node=1"]


def test_auto_dynamic_bsz_on_a_gpu_uses_budgets_no_smaller_than_the_asked_micro_batches():
    _, _, plan = plan_for(QUICKSTART, device="h200", model_spec="qwen2.5-0.5b")
    for name in ("actor", "critic", "ref"):
        role = getattr(plan, name)
        assert role.use_dynamic_bsz is True and role.micro_batch_size_per_gpu is None, name
    assert plan.actor.max_token_len_per_gpu >= 4 * 1024 and plan.actor.forward_max_token_len_per_gpu >= 8 * 1024
    assert plan.critic.max_token_len_per_gpu >= 4 * 1024
    assert "token-budgeted" in plan.reasons["actor.use_dynamic_bsz"]
    assert plan.actor.fused_optimizer and plan.critic.fused_optimizer and not plan.ref.fused_optimizer
    assert "fused AdamW" in plan.reasons["actor.fused_optimizer"]


def test_budgets_still_fit_the_memory_model_on_a_small_gpu():
    _, _, plan = plan_for(QUICKSTART, device="t4", model_spec="qwen2.5-0.5b")
    assert plan.actor.use_dynamic_bsz and plan.predicted_peak_gb <= plan.memory_limit_gb
    assert plan.actor.max_token_len_per_gpu >= 1024   # at least one whole sequence


def test_cpu_and_explicit_false_keep_fixed_micro_batches():
    _, _, cpu = plan_for(QUICKSTART, device="cpu", model_spec="qwen2.5-0.5b")
    # fixed micro-batches (the host's memory may halve them: on CPU nothing can be offloaded)
    assert cpu.actor.use_dynamic_bsz is False and cpu.actor.max_token_len_per_gpu is None
    assert cpu.actor.micro_batch_size_per_gpu in (1, 2, 4)
    assert not cpu.actor.fused_optimizer and "CPU" in cpu.reasons["actor.fused_optimizer"]
    config, _, gpu = plan_for(QUICKSTART + ["actor_rollout_ref.actor.use_dynamic_bsz=false"], device="h200",
                              model_spec="qwen2.5-0.5b")
    assert gpu.actor.use_dynamic_bsz is False and gpu.actor.micro_batch_size_per_gpu == 4
    assert gpu.reasons["actor.use_dynamic_bsz"] == "set by the user"


@pytest.mark.parametrize("offload", [True, False])
def test_fused_optimizer_on_the_device_and_for_the_offloaded_host_step(offload):
    _, _, plan = plan_for(QUICKSTART + [f"actor_rollout_ref.actor.fsdp_config.param_offload={offload}"],
                          device="h200", model_spec="qwen2.5-0.5b")
    assert plan.actor.param_offload is offload
    assert plan.actor.fused_optimizer is True     # this venv's torch (>= 2.4) has the fused CPU kernel
    assert ("fused CPU AdamW" in plan.reasons["actor.fused_optimizer"]) is offload


@pytest.mark.parametrize("version,fused", [("2.3.1+cu121", False), ("2.4.0", True), ("2.11.0+cu128", True),
                                           ("", False)])
def test_offloaded_step_is_fused_from_torch_2_4_else_foreach(version, fused):
    from verl.compat.device.catalog import CATALOG
    from verl.compat.planning.throughput import decide_fused_optimizer

    reasons = {}
    note = lambda key, value, why: reasons.setdefault(key, why) and value  # noqa: E731
    assert decide_fused_optimizer(note, CATALOG["p40"], "actor", True, version) is fused
    assert ("foreach" in reasons["actor.fused_optimizer"]) is (not fused)
    assert decide_fused_optimizer(note, CATALOG["p40"], "critic", True, "2.11.0", eight_bit=True) is False
    assert "AdamW8bit" in reasons["critic.fused_optimizer"]


# the field report's shape on its P40: batch 1, 256 + 256 tokens, every micro-batch 1
FIELD_REPORT = ["data.train_batch_size=1", "data.max_prompt_length=256", "data.max_response_length=256",
                "actor_rollout_ref.actor.ppo_mini_batch_size=1", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
                "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
                "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1", "critic.ppo_micro_batch_size_per_gpu=1",
                "trainer.n_gpus_per_node=1"]


def test_token_budgets_shrink_before_anything_is_offloaded():
    """Budgets are a speed device: on the P40 the fit halves them rather than offload the optimizer
    (the H200 run under the p40 profile: optimizer offload made each update 1.9 s instead of 0.26 s)."""
    _, _, plan = plan_for(FIELD_REPORT, device="p40", model_spec="qwen2.5-0.5b")
    assert plan.actor.use_dynamic_bsz and plan.predicted_peak_gb <= plan.memory_limit_gb
    for name in ("actor", "critic"):
        role = getattr(plan, name)
        assert not role.param_offload and not role.optimizer_offload, name
        assert role.max_token_len_per_gpu >= 512, name   # one whole sequence a pass at least
    assert "nothing offloaded" in plan.reasons["actor.optimizer_offload"]


def test_checkpointing_left_to_compat_is_off_where_activations_fit_and_budgets_shrink_first():
    """The yaml leaves `enable_gradient_checkpointing` to compat: on an H200 the quick-start's activations
    fit whole budgets, so nothing is recomputed; on an A100-40GB the fit halves the budgets (not below
    CHECKPOINT_FLOOR_TOKENS) before it turns recomputation on; a user's `true` is kept."""
    from verl.compat.planning.fit import CHECKPOINT_FLOOR_TOKENS

    _, _, big = plan_for(QUICKSTART, device="h200", model_spec="qwen2.5-0.5b")
    assert not big.actor.gradient_checkpointing and not big.critic.gradient_checkpointing
    assert big.reasons["actor.gradient_checkpointing"] == "activations fit without it"
    assert big.actor.max_token_len_per_gpu == 64 * 1024   # grown to the whole mini-batch (see below)
    _, _, mid = plan_for(QUICKSTART, device="a100-40gb", model_spec="qwen2.5-0.5b")
    assert not mid.actor.gradient_checkpointing
    assert CHECKPOINT_FLOOR_TOKENS <= mid.actor.max_token_len_per_gpu < 16384
    assert mid.predicted_peak_gb <= mid.memory_limit_gb
    _, _, asked = plan_for(QUICKSTART + ["actor_rollout_ref.model.enable_gradient_checkpointing=true"],
                           device="h200", model_spec="qwen2.5-0.5b")
    assert asked.actor.gradient_checkpointing and asked.reasons["actor.gradient_checkpointing"] == "set by the user"


def test_auto_budgets_grow_towards_the_whole_pass_while_the_plan_fits():
    """Left `auto`, each token budget doubles (after every offload, checkpointing and resharding
    decision) towards its whole pass while the plan still fits: on the H200 the quick-start's update
    runs one 64 x 1024-token micro-batch per mini-batch, forwards stop at GROWN_BUDGET_CAP; on an
    A100-80GB the update stops below that because the next doubling does not fit."""
    from verl.compat.planning.fit import GROWN_BUDGET_CAP

    whole_mini_batch = 64 * 1024
    _, _, h200 = plan_for(QUICKSTART, device="h200", model_spec="qwen2.5-0.5b")
    assert h200.actor.max_token_len_per_gpu == h200.critic.max_token_len_per_gpu == whole_mini_batch
    assert h200.actor.forward_max_token_len_per_gpu == h200.ref.max_token_len_per_gpu == GROWN_BUDGET_CAP
    assert h200.reasons["actor.max_token_len_per_gpu"].startswith("grown from 16384 (the whole pass)")
    assert h200.reasons["critic.forward_max_token_len_per_gpu"].startswith("grown from 32768")
    assert h200.memory["required_gb"] <= h200.memory_limit_gb

    _, _, a100 = plan_for(QUICKSTART, device="a100-80gb", model_spec="qwen2.5-0.5b")
    grown = a100.actor.max_token_len_per_gpu
    assert 16384 < grown < whole_mini_batch and a100.memory["required_gb"] <= a100.memory_limit_gb
    # the next doubling, asked for explicitly, does not fit: the fit halves it back
    _, _, asked = plan_for(QUICKSTART + [f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={2 * grown}"],
                           device="a100-80gb", model_spec="qwen2.5-0.5b")
    assert asked.actor.max_token_len_per_gpu < 2 * grown


def test_budgets_the_user_sets_are_not_grown():
    """An explicit budget is kept (and, as upstream, the log-prob passes follow the actor's key); the
    critic's, still `auto`, grows."""
    config, _, plan = plan_for(QUICKSTART + ["actor_rollout_ref.actor.ppo_max_token_len_per_gpu=16384"],
                               device="h200", model_spec="qwen2.5-0.5b")
    assert plan.actor.max_token_len_per_gpu == plan.actor.forward_max_token_len_per_gpu == 16384
    assert plan.ref.max_token_len_per_gpu == 16384
    assert plan.reasons["actor.max_token_len_per_gpu"] == "as configured"
    assert plan.critic.max_token_len_per_gpu == 64 * 1024
    from verl.compat.apply import apply_plan as apply

    apply.resolve_config(config, plan)
    assert config.critic.ppo_max_token_len_per_gpu == config.critic.forward_max_token_len_per_gpu == 64 * 1024
    assert config.actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu == 16384


def test_budgets_grow_less_far_at_several_ranks():
    """At 2+ ranks a grown budget must leave MULTI_RANK_RESHARD_HEADROOM of the device free (the multi-rank
    memory terms are modelled, not measured); one rank may fill the device up to the margin."""
    from verl.compat.planning.fit import MULTI_RANK_RESHARD_HEADROOM

    two = [o if not o.startswith("trainer.n_gpus_per_node") else "trainer.n_gpus_per_node=2" for o in QUICKSTART]
    _, _, one_rank = plan_for(QUICKSTART, device="h200", model_spec="qwen2.5-0.5b")
    # the same per-rank shape at two ranks
    _, _, two_ranks = plan_for(two + ["data.train_batch_size=512", "actor_rollout_ref.actor.ppo_mini_batch_size=128"],
                               device="h200", model_spec="qwen2.5-0.5b")
    assert "grown" in one_rank.reasons["actor.max_token_len_per_gpu"]
    assert one_rank.memory["required_gb"] > two_ranks.memory_limit_gb * (1 - MULTI_RANK_RESHARD_HEADROOM)
    assert two_ranks.memory["required_gb"] <= two_ranks.memory_limit_gb * (1 - MULTI_RANK_RESHARD_HEADROOM)
    assert 16384 < two_ranks.actor.max_token_len_per_gpu < one_rank.actor.max_token_len_per_gpu


def test_auto_micro_batches_divide_each_ranks_mini_batch():
    """`auto` update micro-batches split each data-parallel rank's mini-batch evenly, as the worker requires:
    on CPU too, where the memory model counts one host memory for all the rank processes."""
    from omegaconf import OmegaConf

    from verl.compat.planning.fit import _Batch, halve
    from verl.workers.fsdp_workers import _normalize_mini_batch

    # (device, ranks, prompts per mini-batch, samples per prompt, expected micro-batch)
    for device, ranks, prompts, n, expected in (("cpu", 8, 4, 2, 1),    # 1 row a rank (was 8: the worker refused it)
                                                ("h200", 1, 3, 4, 6),   # 12 rows: 6, not 8
                                                ("h200", 2, 5, 2, 5)):  # 5 rows a rank
        overrides = ["algorithm.adv_estimator=grpo", f"data.train_batch_size={prompts}", "data.max_prompt_length=256",
                     "data.max_response_length=32", f"actor_rollout_ref.rollout.n={n}",
                     f"actor_rollout_ref.actor.ppo_mini_batch_size={prompts}", f"trainer.n_gpus_per_node={ranks}",
                     "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=auto",
                     "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=auto",
                     "actor_rollout_ref.actor.use_dynamic_bsz=false"]
        _, _, plan = plan_for(overrides, device=device, model_spec="qwen2.5-0.5b")
        micro = plan.actor.micro_batch_size_per_gpu
        assert micro == expected, (device, ranks, prompts, n, micro)
        cfg = OmegaConf.create({"ppo_mini_batch_size": prompts, "ppo_micro_batch_size_per_gpu": micro})
        _normalize_mini_batch(cfg, n, ranks, "actor")   # the worker's own check passes
    # halving for memory keeps an update's micro-batch a divisor of the one before; forwards just halve
    smaller, _ = halve(_Batch(7, 14, 6, 12, 14, explicit={}), {}, False, 0)
    assert (smaller.actor, smaller.actor_forward, smaller.critic, smaller.critic_forward, smaller.ref) == (1, 7, 3, 6, 7)
