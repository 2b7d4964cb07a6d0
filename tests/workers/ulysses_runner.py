"""One rank of the Ulysses comparison in test_ulysses.py (launched as a plain process, or called in-process
for the size-1 reference).

Usage: RANK=.. WORLD_SIZE=.. MASTER_ADDR=.. MASTER_PORT=.. python ulysses_runner.py OUT_PT SP MODEL_DIR:VARIANT ...
VARIANT is `<attention>-<padded|packed>[-budget|-checkpointed]` (`budget`: token-budgeted micro-batches, 20
tokens per device, which a sequence-parallel group of sp devices spends as 20 x sp; `checkpointed`: gradient
checkpointing, whose recomputation runs inside backward). For each, on this rank's share of a fixed batch (the share the
worker group would hand it): the actor's log-probs and entropies, one actor update's gradients, the
reference's log-probs, the critic's values and one critic update's gradients.
"""
import dataclasses
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from worker_setup import (  # noqa: E402
    GradRecorder,
    actor_rollout_ref_config,
    close_process_group,
    cpu_plan,
    critic_config,
    ppo_batch,
)

from verl.workers.fsdp_workers import ActorRolloutRefWorker, CriticWorker  # noqa: E402

SP_KEYS = ("actor_rollout_ref__actor__ulysses_sequence_parallel_size", "critic__ulysses_sequence_parallel_size")


def use_varlen_reference_kernel() -> None:
    """torch_varlen with its CPU reference kernel (the real one needs a GPU)."""
    from verl.compat.apply import varlen_attention

    varlen_attention.torch_varlen_kernel = varlen_attention.reference_kernel
    varlen_attention.register_varlen_attention()


def _plan(model_dir: str, sp: int, attn: str, packed: bool, checkpointed: bool):
    """The planner's plan for this world size and sp, with the attention kernel and layout under test."""
    plan = cpu_plan(model_dir, **{key: sp for key in SP_KEYS})
    for role in ("actor", "ref", "critic"):
        role_plan = getattr(plan, role)
        assert role_plan.sequence_parallel_size == sp, (role, role_plan)
        setattr(plan, role, dataclasses.replace(role_plan, attn_implementation=attn, use_remove_padding=packed,
                                                gradient_checkpointing=checkpointed))
    return plan


class ExchangeCounter:
    """Counts the all-to-all exchanges per phase (the proof that attention ran split)."""

    def __init__(self):
        from verl.utils import ulysses

        self.calls, self.phase, inner = {}, None, ulysses._exchange

        def counted(*args, **kwargs):
            self.calls[self.phase] = self.calls.get(self.phase, 0) + 1
            return inner(*args, **kwargs)

        ulysses._exchange = counted


def run_variant(model_dir: str, variant: str, sp: int, counter: ExchangeCounter) -> dict:
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    attn, layout, *option = variant.split("-")
    budget = option == ["budget"]
    plan = _plan(model_dir, sp, attn, layout == "packed", option == ["checkpointed"])
    data = ppo_batch(batch_size=8).chunk(world)[rank]
    out = {}

    # ppo_mini_batch_size 4 prompts x rollout.n 2 = the whole batch in one optimizer step
    dynamic = dict(use_dynamic_bsz=True, ppo_max_token_len_per_gpu=20) if budget else {}
    config = actor_rollout_ref_config(model_dir, ppo_mini_batch_size=4, entropy_coeff=0.01, grad_clip=1e6, **dynamic)
    if budget:
        config.rollout.update(log_prob_use_dynamic_bsz=True, log_prob_max_token_len_per_gpu=20)
        config.ref.update(log_prob_use_dynamic_bsz=True, log_prob_max_token_len_per_gpu=20)
    actor = ActorRolloutRefWorker(config, role="actor", plan=plan)
    actor.init_model()
    counter.phase = "log_probs"
    scored = actor.compute_log_prob(data)
    out["log_probs"], out["entropys"] = scored.batch["old_log_probs"], scored.batch["entropys"]
    data.batch["old_log_probs"] = out["log_probs"]
    recorder = GradRecorder(actor.actor_module.parameters())
    actor.actor.actor_optimizer = recorder
    counter.phase = "update_actor"
    metrics = actor.update_actor(data).meta_info["metrics"]
    out["actor_grads"] = recorder.grads[0]
    out["actor_metrics"] = {k: metrics[k] for k in ("actor/pg_loss", "actor/entropy")}

    ref = ActorRolloutRefWorker(config, role="ref", plan=plan)
    ref.init_model()
    counter.phase = "ref_log_prob"
    out["ref_log_prob"] = ref.compute_ref_log_prob(data).batch["ref_log_prob"]

    critic_budget = dict(dynamic, forward_max_token_len_per_gpu=20) if budget else {}
    critic = CriticWorker(critic_config(model_dir, ppo_mini_batch_size=4, grad_clip=1e6, **critic_budget), plan=plan)
    critic.init_model()
    counter.phase = "values"
    values = critic.compute_values(data).batch["values"]
    out["values"] = values
    data.batch["values"] = values
    recorder = GradRecorder(critic.critic_module.parameters())
    critic.critic.critic_optimizer = recorder
    counter.phase = "update_critic"
    metrics = critic.update_critic(data).meta_info["metrics"]
    out["critic_grads"] = recorder.grads[0]
    out["critic_metrics"] = {"critic/vf_loss": metrics["critic/vf_loss"]}
    out["exchanges"], counter.calls = counter.calls, {}
    return out


def run(jobs: list[tuple[str, str]], sp: int) -> dict:
    torch.set_num_threads(1)
    use_varlen_reference_kernel()
    counter = ExchangeCounter()
    return {f"{model_dir}:{variant}": run_variant(model_dir, variant, sp, counter) for model_dir, variant in jobs}


if __name__ == "__main__":
    out_path, sp = sys.argv[1], int(sys.argv[2])
    jobs = [tuple(arg.rsplit(":", 1)) for arg in sys.argv[3:]]
    torch.save(run(jobs, sp), out_path)
    close_process_group()
