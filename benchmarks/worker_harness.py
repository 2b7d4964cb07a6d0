"""The real workers of one training step in one process, from the stock config and the real plan.

Actor and critic are built side by side, as the trainer colocates them; `StepPhases` runs the step's phases in
the trainer's order on random data. memory_model.py and profile_step.py share it, so both measure the same step.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from harness import ARR, sized


def stock_overrides(shape: dict, profile: str, model: str, val_rows: int | None = None) -> list[str]:
    """The stock command's overrides for a `harness.shape()` (hardware keys left to the planner). Responses run to full
    length (ignore_eos): the worst case, and what a random-weight model does anyway. The code is compiled before
the first phase (compile_warmup=synchronous), so timings and peaks stay comparable with earlier ones."""
    return [*sized(shape), f"{ARR}.model.path={model}", f"critic.model.path={model}",
            f"critic.ppo_mini_batch_size={shape['mini']}", f"{ARR}.rollout.name=hf", f"{ARR}.rollout.ignore_eos=True",
            "trainer.n_gpus_per_node=1", "trainer.nnodes=1",
            # compiled before the first phase, as before background warm-up: a phase's figures are compiled code's
            "compat.compile_warmup=synchronous",
            *([f"compat.device={profile}"] if profile != "auto" else []),
            *([f"data.val_batch_size={val_rows}"] if val_rows is not None else [])]


def prompts(rows: int, prompt: int, vocab: int, seed: int, real: tuple[int, int] | None = None):
    """Left-padded random prompts. `real` = (shortest, longest) real tokens per row, drawn uniformly
    (None: every fourth row a quarter shorter, the rest full length)."""
    import torch

    from verl.protocol import DataProto

    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(10, vocab, (rows, prompt), generator=g)
    mask = torch.ones_like(ids)
    if real is None:
        mask[::4, : prompt // 4] = 0
    else:
        lengths = torch.randint(real[0], real[1] + 1, (rows,), generator=g).clamp(1, prompt)
        mask = (torch.arange(prompt) >= prompt - lengths[:, None]).long()
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return DataProto.from_dict({"input_ids": ids, "attention_mask": mask, "position_ids": pos})


def training_fields(batch, seed: int):
    """What the driver adds between phases (advantages, returns; log-probs/values where a phase did not
    produce them), random but of the right shapes."""
    import torch

    g = torch.Generator().manual_seed(seed)
    mask = batch.batch["response_mask"].float()
    # the random draws stay on the host (one stream of numbers on every device), then join the batch's device
    fields = {k: torch.randn(mask.shape, generator=g).to(mask.device) * mask for k in ("advantages", "returns")}
    batch.batch.update({**fields, **{k: torch.zeros_like(mask) for k in ("old_log_probs", "ref_log_prob", "values")
                                     if k not in batch.batch.keys()}})
    return batch


def synthetic_step_batch(rows: int, prompt: int, response: int, vocab: int):
    """A full-length batch for a warm-up update (it only has to create AdamW's states)."""
    import torch

    from verl.protocol import DataProto

    p = prompts(rows, prompt, vocab, seed=1).batch
    responses = torch.randint(10, vocab, (rows, response))
    rmask = torch.ones_like(responses)
    offsets = torch.arange(1, response + 1)
    batch = DataProto.from_dict({
        "prompts": p["input_ids"], "responses": responses, "response_mask": rmask,
        "input_ids": torch.cat([p["input_ids"], responses], -1),
        "attention_mask": torch.cat([p["attention_mask"], rmask], -1),
        "position_ids": torch.cat([p["position_ids"], p["position_ids"][:, -1:] + offsets], -1)})
    return training_fields(batch, seed=2)


@dataclass
class Workers:
    """The planned config and the workers built from it."""
    config: Any
    plan: Any
    actor: Any
    critic: Any | None
    device: Any
    vocab: int
    rows: int              # rows of one training batch (prompts x rollout.n)
    mini_rows: int         # rows of one actor mini-batch

    def resident(self) -> list:
        """Modules and optimizers holding the step's persistent state."""
        a, c = self.actor, self.critic
        mods = [m for m in (a.actor_module, getattr(a, "ref_module", None), c.critic_module if c else None) if m]
        return mods + [o for o in (a.actor_optimizer, c.critic_optimizer if c else None) if o]


def build_workers(overrides: list[str], total_training_steps: int = 2) -> Workers:
    """Compose, plan and resolve the stock config with `overrides`; build and initialise the workers."""
    from omegaconf import OmegaConf, open_dict

    from verl import compat
    from verl.trainer.config_check import load_config
    from verl.workers.fsdp_workers import ActorRolloutRefWorker, CriticWorker

    config = load_config(overrides)
    plan = compat.build_plan(config)
    compat.resolve_config(config, plan)
    OmegaConf.resolve(config)
    with open_dict(config):
        config[ARR].actor.optim.total_training_steps = total_training_steps
        if "critic" in config and plan.critic is not None:
            config.critic.optim.total_training_steps = total_training_steps
    role = "actor_rollout_ref" if plan.ref is not None else "actor_rollout"
    actor = ActorRolloutRefWorker(config[ARR], role=role, plan=plan)
    actor.init_model()
    critic = None
    if plan.critic is not None:
        critic = CriticWorker(config.critic, plan=plan)
        critic.init_model()
    n = int(config[ARR].rollout.n)
    return Workers(config=config, plan=plan, actor=actor, critic=critic, device=actor.device,
                   vocab=len(actor.tokenizer), rows=int(config.data.train_batch_size) * n,
                   mini_rows=int(config[ARR].actor.ppo_mini_batch_size) * n)


# The trainer's phase order; the names are the workers' methods.
PHASES = ("generate_sequences", "compute_log_prob", "compute_ref_log_prob", "compute_values", "update_critic",
          "update_actor")


@dataclass
class StepPhases:
    """One step's phases on the workers, each a no-argument call; each phase feeds the next (the batch
    generated is the one scored and trained on).

    For a cheaper look at a phase (the profiler's traces grow with every op): `rows` runs scoring and
    updates on the first rows of the batch only (e.g. one mini-batch) and `decode_steps` generates that
    many new tokens; those calls leave the step's batch as it is."""
    w: Workers
    prompt: int
    real_prompt: tuple[int, int] | None = None
    rows: int | None = None
    decode_steps: int | None = None
    eos_share: float = 0.0   # > 0: every (1 / share)-th token id ends a response (see generate_sequences)
    seed: int = 3
    batch: Any = field(default=None, init=False)
    metrics: dict = field(default_factory=dict, init=False)     # each phase's last meta_info["metrics"]

    def available(self) -> list[str]:
        """The phases this plan runs (a reference policy only with KL, a critic only with GAE)."""
        has = {"compute_ref_log_prob": self.w.plan.ref is not None,
               "compute_values": self.w.critic is not None, "update_critic": self.w.critic is not None}
        return [p for p in PHASES if has.get(p, True)]

    def call(self, phase: str) -> None:
        out = getattr(self, phase)()
        self.metrics[phase] = dict(out.meta_info.get("metrics") or {})

    def generate_sequences(self):
        p = prompts(self.w.rows, self.prompt, self.w.vocab, seed=self.seed, real=self.real_prompt)
        if self.eos_share > 0:   # a random-weight model samples near-uniformly: lengths about geometric, mean 1/share
            p.meta_info["eos_token_id"] = list(range(0, self.w.vocab, round(1 / self.eos_share)))
        if self.decode_steps is not None:
            p.meta_info["response_length"] = self.decode_steps
            return self.w.actor.generate_sequences(p)
        self.batch = self.w.actor.generate_sequences(p)
        return self.batch

    def _score(self, method, key: str):
        if self.rows is not None:
            return method(self.batch[: self.rows])
        out = method(self.batch)
        self.batch.batch.update({key: out.batch[key]})
        return out

    def compute_log_prob(self):
        return self._score(self.w.actor.compute_log_prob, "old_log_probs")

    def compute_ref_log_prob(self):
        return self._score(self.w.actor.compute_ref_log_prob, "ref_log_prob")

    def compute_values(self):
        return self._score(self.w.critic.compute_values, "values")

    def _update_batch(self):
        batch = training_fields(self.batch, seed=self.seed + 1)
        return batch if self.rows is None else batch[: self.rows]

    def update_critic(self):
        return self.w.critic.update_critic(self._update_batch())

    def update_actor(self):
        return self.w.actor.update_actor(self._update_batch())

    def validate(self, rows: int) -> None:
        """A greedy validation generate of `rows` prompts."""
        p = prompts(rows, self.prompt, self.w.vocab, seed=self.seed + 2, real=self.real_prompt)
        p.meta_info.update({"validate": True, "do_sample": False})
        self.w.actor.generate_sequences(p)
