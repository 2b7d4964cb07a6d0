"""The PPO / GRPO training loop, driven from one process over Ray worker groups.

The driver holds no model. Each step it sends the batch to the workers in upstream verl's order:

    generate -> reward -> old_log_prob -> ref -> values -> advantages -> update_critic -> update_actor

Advantages, KL-in-reward and all metrics are computed here on the driver (cheap tensor math); every
forward/backward pass runs in the workers. Hardware choices arrive in the compat `Plan`; the trainer
only counts devices through the resource pool.
"""
from __future__ import annotations

import inspect
import math
import os
import uuid
from pprint import pprint

import numpy as np
import torch
from omegaconf import OmegaConf, open_dict
from torch.utils.data import DataLoader, Dataset, Sampler
from tqdm import tqdm

from verl.protocol import DataProto, pad_dataproto_to_divisor, unpad_dataproto
from verl.single_controller.ray import (
    RayClassWithInitArgs,
    RayWorkerGroup,
    ResourcePoolManager,
    create_colocated_worker_cls,
)
from verl.trainer.ppo import core_algos, generation_dump
from verl.trainer.ppo.checkpoint_callback import build_checkpoint_callback
from verl.trainer.ppo.core_algos import AdvantageEstimator, agg_loss
from verl.trainer.ppo.metric_utils import (
    compute_data_metrics,
    compute_throughout_metrics,
    compute_timing_metrics,
    process_validation_metrics,
    reduce_metrics,
)
from verl.trainer.ppo.reward import compute_reward
from verl.trainer.ppo.utils import Role
from verl.utils.checkpoint.checkpoint_manager import (
    find_latest_ckpt_path,
    prune,
    save_data_state,
    saving_step,
    step_of,
)
from verl.utils.checkpoint.manifest import verify
from verl.utils.checkpoint.plain_state import host_rng_state, load_plain, set_host_rng_state
from verl.utils.dataset.resumable_sampler import ResumableSampler
from verl.utils.startup.clock import end_startup, startup_clock
from verl.utils.timer import marked_timer
from verl.utils.torch_functional import masked_mean
from verl.utils.tracking import Tracking


# Validation rows per worker and generate call when no engine chunk is planned (vLLM schedules its own).
VALIDATION_ROWS_PER_WORKER = 256


class TrainingDivergedError(RuntimeError):
    """A loss or training statistic became NaN/inf; continuing would only train on garbage."""


# --------------------------------------------------------------------------- step helpers (pure tensor math)


def compute_response_mask(data: DataProto) -> torch.Tensor:
    """1 for every real response token (the response part of the attention mask)."""
    response_width = data.batch["responses"].shape[-1]
    return data.batch["attention_mask"][:, -response_width:]


def apply_kl_penalty(data: DataProto, kl_ctrl, kl_penalty: str = "kl"):
    """token_level_rewards = token_level_scores - beta * KL(actor || ref) per token; updates the controller."""
    response_mask = data.batch["response_mask"]
    kld = core_algos.kl_penalty(data.batch["old_log_probs"], data.batch["ref_log_prob"], kl_penalty=kl_penalty)
    kld = kld * response_mask
    beta = kl_ctrl.value
    data.batch["token_level_rewards"] = data.batch["token_level_scores"] - beta * kld

    current_kl = masked_mean(kld, mask=response_mask, axis=-1).mean().item()
    kl_ctrl.update(current_kl=current_kl, n_steps=len(data))
    return data, {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta}


def compute_spec_decode_metrics(spec_drafts, spec_accepts, spec_verifies, non_padding_mask=None) -> dict:
    """Speculative-decoding acceptance from per-request counts (drafted, accepted, verification steps).

    Each request's ratios count once, whatever its length: accept rate = accepted / drafted, accept length =
    1 + accepted / verify steps (the bonus token of each step); a request with a zero denominator counts as 0.
    `non_padding_mask` drops padded placeholder rows. All three counts None (no speculative rollout) gives {}.
    """
    counts = (spec_drafts, spec_accepts, spec_verifies)
    if all(c is None for c in counts):
        return {}
    if any(c is None for c in counts):
        raise ValueError("compute_spec_decode_metrics needs all of spec_drafts, spec_accepts and spec_verifies")
    drafts, accepts, verifies = (np.asarray(c, dtype=np.float64).reshape(-1) for c in counts)
    if non_padding_mask is not None:
        keep = np.asarray(non_padding_mask, dtype=bool).reshape(-1)
        drafts, accepts, verifies = drafts[keep], accepts[keep], verifies[keep]
    if drafts.size == 0:
        return {}
    rate = np.divide(accepts, drafts, out=np.zeros_like(accepts), where=drafts > 0)
    length = np.where(verifies > 0, 1.0 + np.divide(accepts, verifies, out=np.zeros_like(accepts), where=verifies > 0), 0.0)
    return {"rollout/spec_accept_rate": float(rate.mean()), "rollout/spec_accept_length": float(length.mean())}


def compute_advantage(
    data: DataProto,
    adv_estimator,
    gamma: float = 1.0,
    lam: float = 1.0,
    num_repeat: int = 1,
    norm_adv_by_std_in_grpo: bool = True,
    config=None,
) -> DataProto:
    """Fill `advantages` and `returns` with the configured estimator (GAE needs `values`, GRPO needs `uid`)."""
    if "response_mask" not in data.batch:
        data.batch["response_mask"] = compute_response_mask(data)
    rewards, mask = data.batch["token_level_rewards"], data.batch["response_mask"]

    if adv_estimator == AdvantageEstimator.GAE:
        advantages, returns = core_algos.compute_gae_advantage_return(
            token_level_rewards=rewards, values=data.batch["values"], response_mask=mask, gamma=gamma, lam=lam
        )
    elif adv_estimator == AdvantageEstimator.GRPO:
        advantages, returns = core_algos.compute_grpo_outcome_advantage(
            token_level_rewards=rewards,
            response_mask=mask,
            index=data.non_tensor_batch["uid"],
            norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo,
        )
    else:
        estimator = core_algos.get_adv_estimator_fn(adv_estimator)
        kwargs = {"token_level_rewards": rewards, "response_mask": mask, "config": config}
        if {"non_tensor_batch", "batch"} <= set(inspect.signature(estimator).parameters):
            kwargs.update(non_tensor_batch=data.non_tensor_batch, batch=data.batch)   # e.g. GDPO's reward columns
        if "uid" in data.non_tensor_batch:
            kwargs["index"] = data.non_tensor_batch["uid"]
        if "reward_baselines" in data.batch:
            kwargs["reward_baselines"] = data.batch["reward_baselines"]
        advantages, returns = estimator(**kwargs)

    data.batch["advantages"] = advantages
    data.batch["returns"] = returns
    return data


def balanced_partitions(lengths: list[int], k: int) -> list[list[int]]:
    """Split indices into k equal-size groups with near-equal total length (longest first, greedy)."""
    size = len(lengths) // k
    parts: list[list[int]] = [[] for _ in range(k)]
    totals = [0] * k
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        open_parts = [p for p in range(k) if len(parts[p]) < size]
        p = min(open_parts, key=lambda p: totals[p])
        parts[p].append(i)
        totals[p] += lengths[i]
    return [sorted(p) for p in parts]


VALIDATION_PEAK = "perf/max_memory_allocated_gb/validation"


def _pop_metrics(output: DataProto) -> dict[str, float]:
    """Take the workers' metrics out of an output's meta_info, so merging it into the batch sees no
    conflicting keys (plan updates are taken by `RayPPOTrainer._pop_metrics` first)."""
    output.meta_info.pop("compat_notes", None)
    return reduce_metrics(output.meta_info.pop("metrics", {}) or {})


def _compile_summary(metrics: dict) -> dict:
    """perf/compiled_layers: 1 where every worker pass of the step ran compiled code, 0 where one ran the
    eager code while the compiled code was still being built (compat.compile_warmup=background);
    perf/compile_s: the seconds torch.compile ran during the step's worker passes. Both absent where
    nothing is compiled."""
    passes = [v for k, v in metrics.items() if k.startswith("perf/compiled_layers/")]
    out = {"perf/compiled_layers": float(min(passes))} if passes else {}
    compiling = [v for k, v in metrics.items() if k.startswith("perf/compile_s/")]
    if compiling:
        out["perf/compile_s"] = float(sum(compiling))
    return out


# Metrics that must stay finite. grad_norm is left out on purpose: with fp16 a dynamic loss scaler
# meets inf gradients routinely and skips that step, which is not a failure.
# Consecutive steps whose gradient norm was not finite (each skipped its optimizer step, or some of its
# mini-batch steps) before training stops: without a grad scaler five in a row mean the gradients are broken
# while the losses are not, and nothing is being learned. An fp16 grad scaler skips on purpose while it
# halves its scale from 65536 to one that fits, so it gets more: 20 halvings take that scale below 0.1.
SKIPPED_UPDATES_LIMIT = 5
SCALED_SKIPPED_UPDATES_LIMIT = 20

_MUST_BE_FINITE = ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "critic/vf_loss",
                   "critic/score/mean", "critic/rewards/mean", "critic/advantages/mean", "critic/values/mean")


def _uses_reference_policy(config) -> bool:
    return bool(config.algorithm.use_kl_in_reward or config.actor_rollout_ref.actor.use_kl_loss)


def spawn_worker_groups(config, role_worker_mapping: dict, resource_pool_manager: ResourcePoolManager, plan=None,
                        worker_group_cls=RayWorkerGroup) -> dict[str, RayWorkerGroup]:
    """Start the worker processes, one per device holding every colocated role (actor+rollout(+ref),
    critic); their constructors run, no model is loaded yet. Returns one group per role name.

    Needs no data set, so `run_ppo` calls it while the driver is still reading and filtering the data.
    """
    resource_pool_manager.create_resource_pool()
    pool_to_classes = {pool: {} for pool in resource_pool_manager.resource_pool_dict.values()}

    def add(group: Role, **init_kwargs) -> None:
        if plan is not None:
            init_kwargs["plan"] = plan
        pool = resource_pool_manager.get_resource_pool(group)
        pool_to_classes[pool][str(group)] = RayClassWithInitArgs(cls=role_worker_mapping[group], **init_kwargs)

    actor_role = Role.ActorRolloutRef if Role.ActorRolloutRef in role_worker_mapping else Role.ActorRollout
    add(actor_role, config=config.actor_rollout_ref, role=str(actor_role))
    if Role.Critic in role_worker_mapping:
        add(Role.Critic, config=config.critic)
    if _uses_reference_policy(config) and Role.RefPolicy in role_worker_mapping:
        add(Role.RefPolicy, config=config.actor_rollout_ref, role="ref")
    if Role.RewardModel in role_worker_mapping:
        add(Role.RewardModel, config=config)

    all_wg = {}
    for pool, class_dict in pool_to_classes.items():
        if not class_dict:
            continue
        colocated = create_colocated_worker_cls(class_dict=class_dict)
        group = worker_group_cls(resource_pool=pool, ray_cls_with_init=colocated)
        all_wg.update(group.spawn(prefix_set=class_dict.keys()))
        print(f"Worker processes: {group.world_size}, each holding roles: {', '.join(class_dict)}", flush=True)
    return all_wg


class RayPPOTrainer:
    """PPO/GRPO over Ray worker groups; `init_workers()` then `fit()`."""

    def __init__(
        self,
        config,
        tokenizer,
        role_worker_mapping: dict,
        resource_pool_manager: ResourcePoolManager,
        ray_worker_group_cls=RayWorkerGroup,
        processor=None,
        train_dataset: Dataset | None = None,
        val_dataset: Dataset | None = None,
        collate_fn=None,
        train_sampler: Sampler | None = None,
        device_name: str | None = None,
        reward_fn=None,
        val_reward_fn=None,
        plan=None,
        worker_groups: dict | None = None,
    ):
        self.config, self.plan = config, plan
        self.tokenizer, self.processor = tokenizer, processor
        self.reward_fn, self.val_reward_fn = reward_fn, val_reward_fn
        self.role_worker_mapping = role_worker_mapping
        self.resource_pool_manager, self.ray_worker_group_cls = resource_pool_manager, ray_worker_group_cls
        self._worker_groups = worker_groups   # from spawn_worker_groups, when started before this trainer
        self._skipped_in_a_row: dict[str, int] = {}   # role -> steps in a row with a non-finite grad norm
        self._plan_lines: set[str] = set()
        self.device_name = device_name or (plan.device_type if plan is not None else config.trainer.get("device"))

        if not config.actor_rollout_ref.hybrid_engine:
            raise ValueError("actor_rollout_ref.hybrid_engine=False is not supported: actor and rollout share weights.")
        if Role.ActorRollout not in role_worker_mapping and Role.ActorRolloutRef not in role_worker_mapping:
            raise ValueError(f"role_worker_mapping needs Role.ActorRollout or Role.ActorRolloutRef, got {list(role_worker_mapping)}")

        algo = config.algorithm
        self.use_critic = Role.Critic in role_worker_mapping
        self.use_rm = Role.RewardModel in role_worker_mapping
        self.use_reference_policy = _uses_reference_policy(config)
        self.kl_ctrl_in_reward = core_algos.get_kl_controller(algo.kl_ctrl) if algo.use_kl_in_reward else None
        if reward_fn is None:
            raise ValueError("RayPPOTrainer needs reward_fn (see verl.trainer.ppo.reward.load_reward_manager).")

        self.checkpoint_callback = build_checkpoint_callback(config)
        self._create_dataloader(train_dataset, val_dataset, collate_fn, train_sampler)

    # ------------------------------------------------------------------ setup

    def _create_dataloader(self, train_dataset, val_dataset, collate_fn, train_sampler) -> None:
        data = self.config.data
        if train_dataset is None or val_dataset is None:
            from verl.utils.dataset.rl_dataset import create_rl_dataset

            train_dataset = train_dataset or create_rl_dataset(data.train_files, data, self.tokenizer, self.processor)
            val_dataset = val_dataset or create_rl_dataset(data.val_files, data, self.tokenizer, self.processor)
        if train_sampler is None:
            from verl.utils.dataset.rl_dataset import create_rl_sampler

            train_sampler = create_rl_sampler(data, train_dataset)
        if collate_fn is None:
            from verl.utils.dataset.rl_dataset import collate_fn

        self.train_dataset, self.val_dataset = train_dataset, val_dataset
        num_workers = data.get("dataloader_num_workers", 0)
        batch_size = data.get("gen_batch_size") or data.train_batch_size
        self.train_sampler = ResumableSampler(train_sampler, batch_size)
        self.train_dataloader = DataLoader(
            train_dataset,
            batch_size=batch_size,
            sampler=self.train_sampler,
            num_workers=num_workers,
            drop_last=True,
            collate_fn=collate_fn,
        )
        self.val_dataloader = DataLoader(
            val_dataset,
            batch_size=data.get("val_batch_size") or len(val_dataset),
            shuffle=data.get("validation_shuffle", False),
            num_workers=num_workers,
            drop_last=False,
            collate_fn=collate_fn,
        )
        if len(self.train_dataloader) == 0:
            raise ValueError(
                f"The training set has {len(train_dataset)} prompts, fewer than one batch of "
                f"data.train_batch_size={data.train_batch_size}: lower the batch size or add data."
            )
        if len(self.val_dataloader) == 0:
            raise ValueError("The validation set (data.val_files) is empty.")

        per_epoch, epochs = len(self.train_dataloader), self.config.trainer.total_epochs
        total_steps = per_epoch * epochs
        requested = self.config.trainer.get("total_training_steps")
        if requested is not None and requested > total_steps:
            # the loop ends with the data: the last step (save, validation) is the last batch of the last epoch
            print(f"WARNING: trainer.total_training_steps={requested} is more than the data holds: "
                  f"{epochs} epoch(s) x {per_epoch} batches = {total_steps} steps, so training runs {total_steps} "
                  f"steps and saves/validates at step {total_steps}. Raise trainer.total_epochs to train longer.",
                  flush=True)
        elif requested is not None:
            total_steps = requested
        self.total_training_steps = total_steps
        print(f"Train dataloader: {per_epoch} batches/epoch, val dataloader: {len(self.val_dataloader)}; "
              f"training will run {total_steps} steps", flush=True)

        # LR schedules (warmup ratio, cosine decay) are sized by the real number of steps, as upstream.
        with open_dict(self.config):
            self.config.actor_rollout_ref.actor.optim.total_training_steps = total_steps
            if OmegaConf.select(self.config, "critic.optim") is not None:
                self.config.critic.optim.total_training_steps = total_steps

    def init_workers(self) -> None:
        """Start one process per device holding every colocated role (actor+rollout(+ref), critic) and
        load the models; worker groups handed in at construction (started while the driver was still
        reading the data) only load."""
        clock = startup_clock()
        spawned_early = self._worker_groups is not None
        if spawned_early:
            all_wg = self._worker_groups
        else:
            all_wg = spawn_worker_groups(self.config, self.role_worker_mapping, self.resource_pool_manager,
                                         self.plan, self.ray_worker_group_cls)
            clock.mark("spawn_workers")
        # Workers started before the data set was filtered got a config without the schedule's length.
        init_kwargs = {"total_training_steps": self.total_training_steps} if spawned_early else {}

        actor_role = Role.ActorRolloutRef if Role.ActorRolloutRef in self.role_worker_mapping else Role.ActorRollout
        if self.use_critic:
            self.critic_wg = all_wg[str(Role.Critic)]
            self._record_init(Role.Critic, self.critic_wg.init_model(**init_kwargs))
        if self.use_rm:
            self.rm_wg = all_wg[str(Role.RewardModel)]
            self._record_init(Role.RewardModel, self.rm_wg.init_model(**init_kwargs))
        if self.use_reference_policy:
            if str(Role.RefPolicy) in all_wg:
                self.ref_policy_wg = all_wg[str(Role.RefPolicy)]
                self._record_init(Role.RefPolicy, self.ref_policy_wg.init_model(**init_kwargs))
            else:
                self.ref_policy_wg = all_wg[str(actor_role)]
        # The actor+rollout starts last, so its memory estimate sees everything else already loaded.
        self.actor_rollout_wg = all_wg[str(actor_role)]
        self._record_init(actor_role, self.actor_rollout_wg.init_model(**init_kwargs))
        clock.mark("init_models")

    @staticmethod
    def _record_init(role: Role, per_rank: list) -> None:
        """Rank 0's pieces of a role's model set-up, for the start-up table (a custom worker may return
        nothing)."""
        laps = per_rank[0] if per_rank else None
        for piece, seconds in (laps.items() if isinstance(laps, dict) else ()):
            startup_clock().detail(f"{role}/{piece}", seconds)

    def _pop_metrics(self, output: DataProto) -> dict[str, float]:
        """The workers' metrics; first, the plan is re-issued for each numerics-guard fallback they
        report, so the plan this trainer holds (and logs) is the one the workers run."""
        for update in output.meta_info.pop("compat_plan_updates", None) or []:
            self._reissue_plan(update)
        return _pop_metrics(output)

    def _reissue_plan(self, update: dict) -> None:
        if self.plan is None:
            if update["line"] not in self._plan_lines:
                self._plan_lines.add(update["line"])
                print(f"verl.compat (worker): {update['line']}", flush=True)
            return
        from verl.compat.apply.precision import describe, guard_fallback

        self.plan, changes = guard_fallback(self.plan, update["role"], update["reason"])
        if changes:   # empty when this update was applied already
            print(f"verl.compat: {describe(changes, update['reason'])}", flush=True)

    # ------------------------------------------------------------------ the loop

    def fit(self) -> None:
        config = self.config
        logger = Tracking(
            project_name=config.trainer.project_name,
            experiment_name=config.trainer.experiment_name,
            default_backend=config.trainer.logger,
            config=OmegaConf.to_container(config, resolve=True),
        )
        self.global_steps = 0
        start_epoch, batches_done = self._load_checkpoint()
        logger.continue_from(self.global_steps)  # the steps after the checkpoint are logged again
        if self.global_steps >= self.total_training_steps:
            print(f"The checkpoint is at step {self.global_steps} of {self.total_training_steps}: nothing left to "
                  "train (raise trainer.total_training_steps or total_epochs to continue).", flush=True)
            logger.finish()
            return
        progress_bar = None
        clock = startup_clock()
        clock.mark("logger_checkpoint")
        try:
            if config.trainer.get("val_before_train", True):
                val_metrics = self._validate()
                pprint(f"Initial validation metrics: {val_metrics}")
                logger.log(data=val_metrics, step=self.global_steps)
                if config.trainer.get("val_only", False):
                    return
                clock.mark("validation")
            startup_metrics = clock.metrics()
            print(clock.table(), flush=True)
            end_startup()

            progress_bar = tqdm(total=self.total_training_steps, initial=self.global_steps, desc="Training Progress")
            self.global_steps += 1
            first_batch = batches_done + 1  # the loaded epoch continues after the batches it already trained on
            for epoch in range(start_epoch, config.trainer.total_epochs):
                for batches_done, batch_dict in enumerate(self.train_dataloader, start=first_batch):
                    is_last_step = self.global_steps >= self.total_training_steps
                    metrics, timing_raw = startup_metrics, {}
                    startup_metrics = {}  # the first step's record carries the start-up breakdown
                    with marked_timer("step", timing_raw):
                        batch = self._train_step(batch_dict, metrics, timing_raw)
                    metrics.update(_compile_summary(metrics))
                    if config.trainer.test_freq > 0 and (is_last_step or self.global_steps % config.trainer.test_freq == 0):
                        with marked_timer("testing", timing_raw):
                            metrics.update(self._validate())

                    metrics.update({"training/global_step": self.global_steps, "training/epoch": epoch})
                    metrics.update(compute_data_metrics(batch=batch, use_critic=self.use_critic))
                    metrics.update(compute_timing_metrics(batch=batch, timing_raw=timing_raw))
                    n_devices = self.resource_pool_manager.get_n_gpus()
                    metrics.update(compute_throughout_metrics(batch=batch, timing_raw=timing_raw, n_gpus=n_devices))
                    if self.plan is not None:
                        metrics["perf/predicted_peak_gb"] = self.plan.predicted_peak_gb
                        if "host_gb_per_worker" in self.plan.memory:   # offloaded plans: beside perf/cpu_memory_used_gb
                            metrics["perf/predicted_host_gb"] = self.plan.memory["host_gb_per_worker"]
                    logger.log(data=metrics, step=self.global_steps)
                    self._check_finite(metrics)  # before saving: a diverged step never becomes a checkpoint
                    self._check_updates(metrics)
                    save_freq = config.trainer.get("save_freq", -1)
                    if save_freq > 0 and (is_last_step or self.global_steps % save_freq == 0):
                        self._save_checkpoint(epoch, batches_done)

                    progress_bar.update(1)
                    self.global_steps += 1
                    if is_last_step:
                        return
                first_batch = 1
        finally:
            if progress_bar is not None:  # also on Ctrl-C: the bar's last line comes before the exit message
                progress_bar.close()
            logger.finish()

    # ------------------------------------------------------------------ checkpoints

    def _checkpoint_root(self) -> str:
        trainer = self.config.trainer
        if trainer.get("default_hdfs_dir") is not None:
            raise ValueError("trainer.default_hdfs_dir is not supported in this build; set it to null and use "
                             "trainer.default_local_dir")
        if not trainer.get("default_local_dir"):
            raise ValueError("set trainer.default_local_dir (where checkpoints go), or trainer.resume_mode=disable "
                             "and trainer.save_freq=-1")
        # absolute, because the worker processes need not share the driver's working directory
        return os.path.abspath(trainer.default_local_dir)

    def _save_checkpoint(self, epoch: int, batches_done: int) -> None:
        """Actor, critic, then data.pt, then the manifest and the tracker: the tracker moves only once all
        are on disk; a failed save leaves no part of this step behind (see `saving_step`)."""
        trainer = self.config.trainer
        root = self._checkpoint_root()
        keep = {"actor": trainer.get("max_actor_ckpt_to_keep"), "critic": trainer.get("max_critic_ckpt_to_keep")}
        with saving_step(root, self.global_steps) as folder:
            self.actor_rollout_wg.save_checkpoint(os.path.join(folder, "actor"), None, self.global_steps,
                                                  max_ckpt_to_keep=keep["actor"])
            if self.use_critic:
                self.critic_wg.save_checkpoint(os.path.join(folder, str(Role.Critic)), None, self.global_steps,
                                               max_ckpt_to_keep=keep["critic"])
            # the driver's own generators too (e.g. a shuffled validation loader draws from them)
            save_data_state(folder, {**self.train_sampler.state_dict(epoch, batches_done),
                                     "driver_rng": host_rng_state()})
        for component, count in keep.items():  # the previous tracked step is no longer protected
            prune(root, component, count)
        print(f"Saved checkpoint {folder}", flush=True)
        self.checkpoint_callback.on_save(self, global_step=self.global_steps, checkpoint_dir=folder, async_save=False)

    def _load_checkpoint(self) -> tuple[int, int]:
        """Restore per trainer.resume_mode; sets global_steps to the checkpoint's step and returns
        (epoch, batches of it already trained on); the dataloader continues after those."""
        trainer = self.config.trainer
        mode = trainer.get("resume_mode", "auto")
        if mode == "disable":
            return 0, 0
        parts = [("actor", self.actor_rollout_wg)] + ([(str(Role.Critic), self.critic_wg)] if self.use_critic else [])
        if mode == "auto":
            folder = find_latest_ckpt_path(self._checkpoint_root(), components=[name for name, _ in parts])
            if folder is None:
                print(f"No checkpoint under {self._checkpoint_root()}: training from scratch", flush=True)
                return 0, 0
        elif mode == "resume_path":
            if not trainer.get("resume_from_path"):
                raise ValueError("trainer.resume_mode=resume_path needs trainer.resume_from_path=<dir>/global_step_<N>")
            folder = os.path.abspath(trainer.resume_from_path)
        else:
            raise ValueError(f"trainer.resume_mode must be auto, disable or resume_path, got {mode!r}")
        step = step_of(folder)
        verify(folder)  # auto mode has checked it already; a named folder that is damaged stops here
        for name, _ in parts:
            if not os.path.isdir(os.path.join(folder, name)):
                raise FileNotFoundError(f"{folder} has no complete {name}/ checkpoint; point "
                                        "trainer.resume_from_path at another global_step_<N> folder")
        data_path = os.path.join(folder, "data.pt")
        if os.path.exists(data_path):
            state = load_plain(data_path)  # first: a refused file stops the resume before any weights load
        else:
            per_epoch = len(self.train_dataloader)
            state = {"epoch": step // per_epoch, "batches_done": step % per_epoch}
            print(f"{data_path} is missing: continuing at epoch {state['epoch']}, batch {state['batches_done'] + 1}, "
                  "without the sampler's random state", flush=True)
        print(f"Resuming from {folder} (step {step})", flush=True)
        for name, group in parts:
            group.load_checkpoint(os.path.join(folder, name),
                                  del_local_after_load=bool(trainer.get("del_local_ckpt_after_load", False)))
        self.global_steps = step
        if state.get("driver_rng") is not None:
            set_host_rng_state(state["driver_rng"])
        self.train_sampler.load_state_dict(state)
        return int(state["epoch"]), int(state["batches_done"])

    def _train_step(self, batch_dict: dict, metrics: dict, timing_raw: dict) -> DataProto:
        """One PPO iteration on one batch of prompts, in upstream's order. Returns the full batch."""
        config = self.config
        rollout_n = config.actor_rollout_ref.rollout.n

        batch = DataProto.from_single_dict(batch_dict)
        batch.meta_info["temperature"] = config.actor_rollout_ref.rollout.temperature
        # One uid per prompt: GRPO/RLOO group the rollout.n responses of a prompt by it.
        batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(batch))], dtype=object)
        gen_batch = self._pop_gen_batch(batch)
        gen_batch.meta_info.update(self._generation_meta(validate=False))
        reward_baselines = None
        if config.algorithm.adv_estimator == AdvantageEstimator.REMAX:
            with marked_timer("gen_max", timing_raw):
                reward_baselines = self._greedy_baseline_rewards(batch, gen_batch)
        gen_batch = gen_batch.repeat(repeat_times=rollout_n, interleave=True)

        # 1. generate
        with marked_timer("gen", timing_raw):
            gen_output = self.actor_rollout_wg.generate_sequences(gen_batch)
            metrics.update(self._pop_metrics(gen_output))
            gen_output.meta_info.pop("timing", None)
        batch = batch.repeat(repeat_times=rollout_n, interleave=True).union(gen_output)
        if reward_baselines is not None:
            batch.batch["reward_baselines"] = reward_baselines.repeat_interleave(rollout_n)
        if "response_mask" not in batch.batch:
            batch.batch["response_mask"] = compute_response_mask(batch)
        if config.trainer.get("balance_batch", False):
            self._balance_batch(batch, metrics)
        batch.meta_info["global_token_num"] = batch.batch["attention_mask"].sum(-1).tolist()

        # 2. reward (the reward model's scores first, for the reward manager to use)
        with marked_timer("reward", timing_raw):
            batch = self._with_rm_scores(batch, metrics)
            reward_tensor, reward_extra_info = compute_reward(batch, self.reward_fn)

        # 3. log-probs of the sampling policy (the PPO ratio's denominator)
        with marked_timer("old_log_prob", timing_raw):
            old_log_prob = self.actor_rollout_wg.compute_log_prob(batch)
            metrics.update(self._pop_metrics(old_log_prob))
            if "entropys" in old_log_prob.batch:
                entropys = old_log_prob.batch.pop("entropys")
                metrics["actor/entropy"] = agg_loss(
                    loss_mat=entropys, loss_mask=batch.batch["response_mask"],
                    loss_agg_mode=config.actor_rollout_ref.actor.loss_agg_mode,
                ).item()
            batch = batch.union(old_log_prob)

        # 4. reference log-probs (for KL in the reward or as a loss)
        if self.use_reference_policy:
            with marked_timer("ref", timing_raw):
                ref_log_prob = self.ref_policy_wg.compute_ref_log_prob(batch)
                metrics.update(self._pop_metrics(ref_log_prob))
                batch = batch.union(ref_log_prob)

        # 5. values
        if self.use_critic:
            with marked_timer("values", timing_raw):
                values = self.critic_wg.compute_values(batch)
                metrics.update(self._pop_metrics(values))
                batch = batch.union(values)

        # 6. advantages (on the driver)
        with marked_timer("adv", timing_raw):
            batch.batch["token_level_scores"] = reward_tensor
            if reward_extra_info:
                batch.non_tensor_batch.update({k: np.array(v) for k, v in reward_extra_info.items()})
            if config.algorithm.use_kl_in_reward:
                batch, kl_metrics = apply_kl_penalty(batch, self.kl_ctrl_in_reward, config.algorithm.kl_penalty)
                metrics.update(kl_metrics)
            else:
                batch.batch["token_level_rewards"] = batch.batch["token_level_scores"]
            batch = compute_advantage(
                batch,
                adv_estimator=config.algorithm.adv_estimator,
                gamma=config.algorithm.gamma,
                lam=config.algorithm.lam,
                num_repeat=rollout_n,
                norm_adv_by_std_in_grpo=config.algorithm.get("norm_adv_by_std_in_grpo", True),
                config=config.algorithm,
            )

        if config.algorithm.adv_estimator == "gdpo":   # each reward component's spread, as upstream logs it
            for key in config.algorithm.get("gdpo_reward_keys") or []:
                values = np.asarray(reward_extra_info.get(key, []), dtype=np.float64)
                if values.size:
                    metrics.update({f"gdpo/{key}/{name}": float(fn(values)) for name, fn in
                                    (("mean", np.mean), ("std", np.std), ("max", np.max), ("min", np.min))})

        folder = config.trainer.get("rollout_data_dir")
        if folder:
            with marked_timer("dump_rollout_generations", timing_raw):
                columns = generation_dump.samples(self.tokenizer, batch, reward_tensor.sum(-1).tolist())
                generation_dump.dump(folder, self.global_steps, columns, reward_extra_info)

        # 7. critic update
        if self.use_critic:
            with marked_timer("update_critic", timing_raw):
                metrics.update(self._pop_metrics(self.critic_wg.update_critic(batch)))

        # 8. actor update, once the critic has warmed up
        if config.trainer.critic_warmup <= self.global_steps:
            with marked_timer("update_actor", timing_raw):
                metrics.update(self._pop_metrics(self.actor_rollout_wg.update_actor(batch)))
        return batch

    # ------------------------------------------------------------------ pieces of a step

    def _pop_gen_batch(self, batch: DataProto) -> DataProto:
        """Move what the rollout needs (prompt tensors, raw prompt ids) out of the batch."""
        tensor_keys = [k for k in ("input_ids", "attention_mask", "position_ids") if k in batch.batch]
        non_tensor_keys = [k for k in ("raw_prompt_ids", "raw_prompt", "multi_modal_data", "tools_kwargs",
                                       "interaction_kwargs", "agent_name") if k in batch.non_tensor_batch]
        gen_batch = batch.pop(batch_keys=tensor_keys, non_tensor_batch_keys=non_tensor_keys)
        if "multi_modal_inputs" in batch.non_tensor_batch:  # shared: the built-in engine's prefill and the
            # log-prob passes both read the pixels, and the engine hands none back
            gen_batch.non_tensor_batch["multi_modal_inputs"] = batch.non_tensor_batch["multi_modal_inputs"]
        return gen_batch

    def _greedy_baseline_rewards(self, batch: DataProto, gen_batch: DataProto) -> torch.Tensor:
        """ReMax's baseline: the reward of one greedy response per prompt (sequence sums, one per prompt)."""
        greedy = DataProto(batch=gen_batch.batch.clone(), non_tensor_batch=dict(gen_batch.non_tensor_batch),
                           meta_info={**gen_batch.meta_info, "do_sample": False})
        padded, pad_size = pad_dataproto_to_divisor(greedy, self.actor_rollout_wg.world_size)
        output = self.actor_rollout_wg.generate_sequences(padded)
        output.meta_info.pop("metrics", None)
        output.meta_info.pop("timing", None)
        scored = DataProto(batch=None, non_tensor_batch=dict(batch.non_tensor_batch),
                           meta_info=dict(batch.meta_info)).union(unpad_dataproto(output, pad_size=pad_size))
        reward_tensor, _ = compute_reward(self._with_rm_scores(scored), self.reward_fn)
        return reward_tensor.sum(dim=-1)

    def _with_rm_scores(self, batch: DataProto, metrics: dict | None = None) -> DataProto:
        """`batch` with the reward model's `rm_scores` (unchanged without a reward model)."""
        if not self.use_rm or "rm_scores" in batch.batch.keys():
            return batch
        padded, pad_size = pad_dataproto_to_divisor(batch, self.rm_wg.world_size)
        output = self.rm_wg.compute_rm_score(padded)
        found = self._pop_metrics(output)
        if metrics is not None:
            metrics.update(found)
        return batch.union(unpad_dataproto(output, pad_size=pad_size))

    def _generation_meta(self, validate: bool) -> dict:
        rollout = self.config.actor_rollout_ref.rollout
        meta = {
            "eos_token_id": self.tokenizer.eos_token_id,
            "pad_token_id": self.tokenizer.pad_token_id,
            "recompute_log_prob": False,
            "global_steps": self.global_steps,
        }
        if validate:
            meta.update({"do_sample": rollout.val_kwargs.do_sample, "validate": True})
        return meta

    def _balance_batch(self, batch: DataProto, metrics: dict) -> None:
        """Reorder so each data-parallel rank receives about the same number of tokens."""
        world_size = self.actor_rollout_wg.world_size
        lengths = batch.batch["attention_mask"].sum(-1).tolist()
        parts = balanced_partitions(lengths, world_size)
        batch.reorder(torch.tensor([i for part in parts for i in part]))
        totals = [sum(lengths[i] for i in part) for part in parts]
        metrics.update({
            "global_seqlen/min": min(lengths), "global_seqlen/max": max(lengths),
            "global_seqlen/balanced_min": min(totals), "global_seqlen/balanced_max": max(totals),
            "global_seqlen/minmax_diff": max(totals) - min(totals), "global_seqlen/mean": sum(totals) / len(totals),
        })

    def _validate(self) -> dict[str, float]:
        """Generate on the validation set with rollout.val_kwargs and score with val_reward_fn."""
        val_n = self.config.actor_rollout_ref.rollout.val_kwargs.n
        reward_fn = self.val_reward_fn or self.reward_fn
        data_sources, uids, scores = [], [], []
        extra_infos: dict[str, list] = {}
        dump_to = self.config.trainer.get("validation_data_dir")
        dumped: dict[str, list] = {}
        progress = tqdm(total=len(self.val_dataset) * val_n, desc="Validation", unit="seq")
        peaks = []  # the workers' allocator peak per generate call, to check the plan's validation phase
        for batch_dict in self.val_dataloader:
            batch = DataProto.from_single_dict(batch_dict)
            batch.non_tensor_batch["uid"] = np.array([str(uuid.uuid4()) for _ in range(len(batch))], dtype=object)
            batch = batch.repeat(repeat_times=val_n, interleave=True)
            gen_batch = self._pop_gen_batch(batch)
            gen_batch.meta_info.update(self._generation_meta(validate=True))

            outputs = []
            for piece in gen_batch.split(self._validation_piece_rows()):
                padded, pad_size = pad_dataproto_to_divisor(piece, self.actor_rollout_wg.world_size)
                output = self.actor_rollout_wg.generate_sequences(padded)
                # validation metrics are computed below; this applies plan updates and keeps the memory peak
                peaks += [v for k, v in self._pop_metrics(output).items() if k == VALIDATION_PEAK]
                output.meta_info.pop("timing", None)
                outputs.append(unpad_dataproto(output, pad_size=pad_size))
                progress.update(len(piece))
            batch = batch.union(outputs[0] if len(outputs) == 1 else DataProto.concat(outputs))

            reward_tensor, reward_extra_info = compute_reward(self._with_rm_scores(batch), reward_fn)
            batch_scores = reward_tensor.sum(-1).tolist()
            if dump_to:
                for key, values in generation_dump.samples(self.tokenizer, batch, batch_scores).items():
                    dumped.setdefault(key, []).extend(values)
            scores.extend(batch_scores)
            for key, values in reward_extra_info.items():
                extra_infos.setdefault(key, []).extend(np.asarray(values).tolist())
            uids.extend(batch.non_tensor_batch["uid"].tolist())
            data_sources.extend(batch.non_tensor_batch.get("data_source", np.array(["unknown"] * len(batch))).tolist())

        progress.close()
        if dump_to:
            generation_dump.dump(dump_to, self.global_steps, dumped, extra_infos)
        infos = {"reward": scores}
        infos.update({k: v for k, v in extra_infos.items() if len(v) == len(scores) and k != "reward"})
        results = process_validation_metrics(data_sources, uids, infos)

        # "val-core" holds the headline numbers (mean/best/maj at the largest n of the main variable),
        # everything else goes to "val-aux", as upstream.
        metrics = {VALIDATION_PEAK: max(peaks)} if peaks else {}
        for source, by_var in results.items():
            core_var = "acc" if "acc" in by_var else "reward"
            for var, by_metric in by_var.items():
                n_max = max(int(name.split("@")[-1].split("/")[0]) for name in by_metric)
                for name, value in by_metric.items():
                    is_core = var == core_var and name.split("@")[0] in ("mean", "maj", "best") and f"@{n_max}" in name
                    metrics[f"{'val-core' if is_core else 'val-aux'}/{source}/{var}/{name}"] = value
        return metrics

    def _validation_piece_rows(self) -> int:
        """Rows per generate call in validation: one engine chunk per worker, so the progress bar moves
        as each chunk finishes (a whole validation set in one call showed nothing for minutes)."""
        micro = self.plan.rollout.micro_batch_size if self.plan is not None else \
            self.config.actor_rollout_ref.rollout.get("micro_batch_size")
        per_worker = micro if isinstance(micro, int) and micro > 0 else VALIDATION_ROWS_PER_WORKER
        return per_worker * self.actor_rollout_wg.world_size

    def _check_updates(self, metrics: dict) -> None:
        """Stop when a role's gradient norm has not been finite for SKIPPED_UPDATES_LIMIT steps in a row
        (SCALED_SKIPPED_UPDATES_LIMIT for a role the plan gives a grad scaler)."""
        skipped = self._skipped_in_a_row
        for role in ("actor", "critic"):
            norm = metrics.get(f"{role}/grad_norm")
            if norm is None:
                continue
            skipped[role] = 0 if math.isfinite(norm) else skipped.get(role, 0) + 1
            scaled = bool(getattr(getattr(self.plan, role, None), "grad_scaler", False))
            if skipped[role] >= (SCALED_SKIPPED_UPDATES_LIMIT if scaled else SKIPPED_UPDATES_LIMIT):
                model = "actor_rollout_ref.model" if role == "actor" else "critic.model"
                raise TrainingDivergedError(
                    f"Training stopped at step {self.global_steps}: the {role}'s gradient norm was not finite in "
                    f"each of the last {skipped[role]} steps, so their optimizer steps were skipped and nothing was "
                    "learned, while the losses stayed finite: the gradient computation is broken, not the data. "
                    "Nothing written before was touched. To narrow it down: run the attention in another kernel "
                    f"({model}.attn_implementation=eager) or in float32 (the compat plan printed at start-up "
                    "says which dtype and attention were chosen; `python -m verl.compat` explains how to "
                    "override them)."
                )

    def _check_finite(self, metrics: dict) -> None:
        bad = {k: metrics[k] for k in _MUST_BE_FINITE if k in metrics and not math.isfinite(metrics[k])}
        if not bad:
            return
        if "critic/score/mean" in bad:
            raise TrainingDivergedError(
                f"Training stopped at step {self.global_steps}: the reward function returned a non-finite score "
                f"({bad}). Fix the reward function (custom_reward_function / reward_model.reward_manager); this "
                "is not a training instability."
            )
        actor = self.config.actor_rollout_ref.actor
        raise TrainingDivergedError(
            f"Training stopped at step {self.global_steps}: {bad} is not finite. This step's metrics were "
            "logged and nothing written before was touched. To fix: lower actor_rollout_ref.actor.optim.lr "
            f"(now {actor.optim.lr}) and critic.optim.lr, keep actor_rollout_ref.actor.grad_clip small "
            f"(now {actor.get('grad_clip')}), or run in float32 (the compat plan printed at start-up says which "
            "dtype was chosen; `python -m verl.compat` explains how to override it)."
        )
