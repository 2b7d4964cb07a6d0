"""Supervised fine-tuning: `python -m verl.trainer.sft_trainer` (one process) or
`torchrun --nproc_per_node=N -m verl.trainer.sft_trainer` (N ranks), with upstream 0.9.1's keys
(`config/sft_trainer_engine.yaml`).

The model is set up by the compat plan exactly as main_ppo's actor (verl/compat/planning/sft.py): dtype,
attention, FSDP2 wrapping, offload, gradient checkpointing, micro-batches, the float16 numerics guard.
The loss is the mean negative log-likelihood of the assistant tokens of the whole batch (over all
ranks), computed in float32. Checkpoints go to `trainer.default_local_dir/global_step_<N>/` with a
complete Hugging Face folder in `huggingface/` (checkpoint.save_contents has hf_model), which
`actor_rollout_ref.model.path` of main_ppo can point to. With `model.lora_rank` > 0 only peft adapters
train: the shards hold them under peft's names beside `lora_train_meta.json` (upstream's layout),
`huggingface/` holds the merged weights, and `python -m verl.model_merger merge` writes the adapters
alone as `lora_adapter/` for main_ppo's `actor_rollout_ref.model.lora_adapter_path`.
"""
from __future__ import annotations

import contextlib
import math
import os
import shutil
import sys
import time

import torch
import torch.distributed as dist

from verl.utils import ulysses
from verl.utils.checkpoint.checkpoint_manager import STEP_PREFIX, step_of, tracked_step, write_tracker

CONFIG_ERROR_EXIT = 2
SP_KEY = "engine.ulysses_sequence_parallel_size"
# upstream's word for trainer.test_freq / save_freq: once per epoch
EVERY_EPOCH = "after_each_epoch"
# feature switches of upstream's SFT config this build does not implement: (key, is on, feature)
_UNSUPPORTED = (
    ("model.enable_activation_offload", bool, "activation offload"),
    ("data.custom_cls.path", bool, "a custom SFT dataset class"),
    ("trainer.default_hdfs_dir", bool, "copying checkpoints to HDFS"),
)


def config_problems(config) -> list[str]:
    from omegaconf import OmegaConf

    problems = [f"{key}={OmegaConf.select(config, key)!r} asks for {what}, which this build's SFT trainer does not "
                "implement; remove the override" for key, on, what in _UNSUPPORTED if on(OmegaConf.select(config, key))]
    for key in ("trainer.test_freq", "trainer.save_freq"):
        value = OmegaConf.select(config, key)
        if value != EVERY_EPOCH and not (isinstance(value, int) and not isinstance(value, bool)):
            problems.append(f"{key}={value!r}: a number of steps (-1 for never) or {EVERY_EPOCH}")
    if config.trainer.resume_mode not in ("auto", "disable", "resume_path"):
        problems.append(f"trainer.resume_mode={config.trainer.resume_mode!r}; use auto, disable or resume_path")
    if config.trainer.resume_mode == "resume_path" and not config.trainer.resume_from_path:
        problems.append("trainer.resume_mode=resume_path needs trainer.resume_from_path=<dir>/global_step_<N>")
    return problems


def _overlong_problem(key: str, dataset) -> str | None:
    rows = dataset.overlong_rows()
    if not rows:
        return None
    shown = ", ".join(f"row {i}: {n} tokens" for i, n in rows[:3])
    return (f"data.{key}: {len(rows)} conversation(s) over data.max_length={dataset.max_length} ({shown}"
            f"{', ...' if len(rows) > 3 else ''}); raise data.max_length or set data.truncation=left/right")


def micro_batches(rows: list[dict], size: int | None, token_budget: int | None) -> list[list[dict]]:
    """Consecutive rows per micro-batch: `size` rows, or (token budget) as many as fit padded to their longest."""
    if token_budget is None:
        return [rows[i:i + size] for i in range(0, len(rows), size)]
    out, current, longest = [], [], 0
    for row in rows:
        length = len(row["input_ids"])
        if current and max(longest, length) * (len(current) + 1) > token_budget:
            out.append(current)
            current, longest = [], 0
        current.append(row)
        longest = max(longest, length)
    return out + ([current] if current else [])


class SFTTrainer:
    """One rank of an SFT run: its share of each batch, one optimizer step per batch."""

    def __init__(self, config, plan=None, device_index: int | None = None):
        """`device_index`: the accelerator this rank uses (torchrun's LOCAL_RANK when not given)."""
        from verl.compat.apply.apply_plan import apply_in_process
        from verl.compat.planning.sft import build_sft_plan
        from verl.utils import fsdp_utils

        self.config = config
        self.plan = plan if plan is not None else build_sft_plan(config)
        index = int(os.environ.get("LOCAL_RANK", 0)) if device_index is None else device_index
        self.device = apply_in_process(self.plan, index)
        self.rank, self.world = fsdp_utils.init_distributed(self.plan.dist_backend)
        # Ulysses: groups of `sp` consecutive ranks share rows and split each sequence (verl/utils/ulysses.py)
        self.sp_group = ulysses.sequence_parallel_group(self.plan.actor.sequence_parallel_size, SP_KEY)
        self.sp = ulysses.group_size(self.sp_group)
        self.dp_rank, self.dp_world = self.rank // self.sp, self.world // self.sp
        self._shard = None   # the last split forward's layout, re-entered for its backward
        self._build_data()
        self._build_model()

    # ------------------------------------------------------------------ set-up

    def _build_data(self) -> None:
        from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset
        from verl.workers.model_building.loading import load_tokenizer

        model, data = self.config.model, self.config.data
        self.tokenizer = load_tokenizer(model.get("tokenizer_path") or model.path, bool(model.trust_remote_code))
        if model.get("custom_chat_template"):
            self.tokenizer.chat_template = model.custom_chat_template
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None \
            else self.tokenizer.eos_token_id
        self.train_set = MultiTurnSFTDataset(data.train_files, self.tokenizer, data,
                                             max_samples=int(data.get("train_max_samples", -1) or -1))
        self.val_set = MultiTurnSFTDataset(data.val_files, self.tokenizer, data,
                                           max_samples=int(data.get("val_max_samples", -1) or -1)) \
            if data.get("val_files") else None
        problems = [_overlong_problem(key, dataset) for key, dataset in
                    (("train_files", self.train_set), ("val_files", self.val_set)) if dataset is not None]
        if any(problems):
            raise ValueError("; ".join(p for p in problems if p))
        self.batch_size = int(data.train_batch_size)
        if self.batch_size % self.dp_world:
            raise ValueError(f"data.train_batch_size={self.batch_size} does not split evenly over {self.dp_world} "
                             f"data-parallel ranks ({self.world} ranks / {SP_KEY}={self.sp})")
        self.steps_per_epoch = len(self.train_set) // self.batch_size
        if self.steps_per_epoch == 0:
            raise ValueError(f"data.train_files has {len(self.train_set)} conversations, fewer than "
                             f"data.train_batch_size={self.batch_size}")
        limit = self.config.trainer.get("total_training_steps")
        self.total_steps = int(limit) if limit else self.steps_per_epoch * int(self.config.trainer.total_epochs)

    def _build_model(self) -> None:
        from omegaconf import OmegaConf

        from verl.utils import lora
        from verl.workers.model_building.loading import build_model
        from verl.workers.fsdp_workers import _build_optimizer, _checkpoint_manager, _PlannedModel

        role = self.plan.actor
        model_cfg = self.config.model
        self.planned = _PlannedModel("actor", role, self.plan.device_type)
        module = build_model(model_cfg.path, role, trust_remote_code=bool(model_cfg.trust_remote_code),
                             override_config=dict(model_cfg.get("override_config") or {}), train=True)
        if role.lora_rank > 0:   # only the adapters train; checkpoints hold them under peft's names
            module = lora.add_adapters(module, model_cfg, role.lora_rank, self.planned.param_dtype,
                                       seed=int(self.config.engine.get("seed", 42)))
        elif model_cfg.get("lora_adapter_path"):
            raise ValueError("model.lora_adapter_path is set but model.lora_rank is 0: set model.lora_rank to the "
                             "adapter's rank to continue training it")
        ulysses.install(module, self.sp, SP_KEY)
        self.module = self.planned.shard(module, compile_layers=self.plan.torch_compile)
        optim = OmegaConf.to_container(self.config.optim, resolve=True)
        optim["total_training_steps"] = self.total_steps
        self.optimizer, self.scheduler = _build_optimizer(self.module, OmegaConf.create(optim), role.fused_optimizer)
        self.planned.place_optimizer(self.optimizer, self.device)
        self.checkpoints = _checkpoint_manager(self.planned, self.module, self.optimizer, self.scheduler,
                                               self.tokenizer, self.config.get("checkpoint"))
        self.micro = role.micro_batch_size_per_gpu or 1
        # a rank of a Ulysses group holds 1/sp of each sequence: its micro-batches may hold sp times the tokens
        self.token_budget = role.max_token_len_per_gpu * self.sp if role.use_dynamic_bsz else None

    # ------------------------------------------------------------------ the loss

    def _batch_rows(self, dataset, indices: list[int]) -> list[dict]:
        return [dataset[i] for i in indices]

    def _nll(self, rows: list[dict]) -> tuple[torch.Tensor, int]:
        """Summed negative log-likelihood (float32) of the trained tokens of `rows`, and their count; under
        Ulysses, of this rank's slice of the sequence (the group's slices partition the rows' tokens)."""
        from verl.utils.dataset.multiturn_sft_dataset import collate_sft
        from verl.utils.torch_functional import logprobs_from_logits

        batch = {k: v.to(self.device) for k, v in collate_sft(rows, self.pad_id).items()}
        ids, mask, positions = batch["input_ids"], batch["attention_mask"], batch["position_ids"]
        # position t predicts token t + 1: labels and mask shifted left by one (the last position predicts
        # nothing). Shifting them rather than slicing the logits keeps the (rows, tokens, vocab) logits whole,
        # so neither the forward nor the backward makes another vocabulary-wide copy.
        labels = ids.roll(-1, dims=1)
        target = (batch["loss_mask"] * mask).roll(-1, dims=1).float()
        target[:, -1] = 0
        if self.sp_group is None:
            with self.planned.precision.autocast():
                logits = self.module(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False).logits
        else:   # padded on the right to a multiple of sp; padding is masked and trains nothing
            ids, mask, positions, labels, target = (ulysses.pad_to_multiple(t, 1, self.sp)
                                                    for t in (ids, mask, positions, labels, target))
            self._shard = ulysses.sharded(self.sp_group, attention_mask=mask)
            with self._shard, self.planned.precision.autocast():
                logits = self.module(input_ids=ulysses.local_slice(ids, 1, self.sp_group), attention_mask=None,
                                     position_ids=ulysses.local_slice(positions, 1, self.sp_group),
                                     use_cache=False).logits
            labels, target = (ulysses.local_slice(t, 1, self.sp_group) for t in (labels, target))
        logp = logprobs_from_logits(logits, labels)
        return -(logp * target).sum(), int(target.sum().item())

    def _tokens(self, rows: list[dict]) -> int:
        return sum(int(r["loss_mask"][1:].sum()) for r in rows)

    def _global(self, value: float) -> float:
        if self.world == 1:
            return value
        t = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(t)
        return float(t.item())

    def train_step(self, rows: list[dict]) -> dict[str, float]:
        """One optimizer step on this rank's `rows`; the loss is normalised by the batch's trained tokens
        over all ranks (times the rank count: gradient reduction averages over ranks)."""
        from verl.utils.fsdp_utils import optimizer_step

        self._guard(rows)
        self.module.train()
        # the ranks of a Ulysses group hold the same rows: each token counted once
        tokens = max(self._global(self._tokens(rows)) / self.sp, 1.0)
        total = 0.0
        for part in micro_batches(rows, self.micro, self.token_budget):
            nll, _ = self._nll(part)
            loss = nll / tokens * self.world
            scaler = self.planned.precision.scaler
            # gradient checkpointing recomputes layers inside backward: in the split forward's layout
            with self._shard if self.sp_group is not None else contextlib.nullcontext():
                (scaler.scale(loss) if scaler is not None else loss).backward()
            total += float(loss.detach()) / self.world
        grad_norm, stepped = optimizer_step(self.optimizer, self.module.parameters(),
                                            self.config.optim.get("clip_grad"), self.planned.precision.scaler)
        lr = self.scheduler.get_last_lr()[0]
        self.scheduler.step()
        return {"train/loss": self._global(total), "train/grad_norm": grad_norm, "train/lr": lr,
                "train/global_tokens": tokens, "train/step_skipped": float(not stepped)}

    def _guard(self, rows: list[dict]) -> None:
        """The plan's float16 numerics guard on the first batch; float32 from then on if it fails."""
        if not self.planned.guard_pending:
            return
        from verl.compat.apply.precision import guard_fallback
        from verl.utils.dataset.multiturn_sft_dataset import collate_sft

        batch = {k: v.to(self.device) for k, v in collate_sft(rows, self.pad_id).items()}
        reason = self.planned.check_numerics(self.module, batch)
        if reason is not None:
            self.plan, changes = guard_fallback(self.plan, "actor", reason)
            self.planned.apply(self.plan.actor)
            if self.rank == 0:
                print(f"verl.compat: {reason}; {', '.join(str(c) for c in changes)}", flush=True)

    @torch.no_grad()
    def validate(self) -> float:
        """Token-mean negative log-likelihood of the validation set (over all ranks)."""
        self.module.eval()
        indices = list(range(self.dp_rank, len(self.val_set), self.dp_world))
        nll, count = 0.0, 0
        for part in micro_batches(self._batch_rows(self.val_set, indices), self.micro, self.token_budget):
            value, n = self._nll(part)
            nll, count = nll + float(value), count + n
        return self._global(nll) / max(self._global(count), 1.0)

    # ------------------------------------------------------------------ the loop

    def _order(self, epoch: int) -> list[int]:
        generator = torch.Generator().manual_seed(int(self.config.trainer.seed) + epoch)
        return torch.randperm(len(self.train_set), generator=generator).tolist()

    def _rows_of_step(self, step: int) -> list[dict]:
        """This rank's rows of global step `step` (1-based): the same on every run with the same seed."""
        epoch, within = divmod(step - 1, self.steps_per_epoch)
        batch = self._order(epoch)[within * self.batch_size:(within + 1) * self.batch_size]
        return self._batch_rows(self.train_set, batch[self.dp_rank::self.dp_world])

    def _resume(self) -> int:
        trainer = self.config.trainer
        root = trainer.default_local_dir
        if trainer.resume_mode == "disable":
            return 0
        if trainer.resume_mode == "resume_path":
            folder = trainer.resume_from_path
        else:
            step = tracked_step(root) if os.path.isdir(root) else None
            if step is None:
                return 0
            folder = os.path.join(root, f"{STEP_PREFIX}{step}")
        self.checkpoints.load_checkpoint(folder)
        if self.rank == 0:
            print(f"Resumed from {folder}", flush=True)
        return step_of(folder)

    def save(self, step: int) -> str:
        trainer = self.config.trainer
        root = trainer.default_local_dir
        folder = os.path.join(root, f"{STEP_PREFIX}{step}")
        self.checkpoints.save_checkpoint(folder, global_step=step)
        if self.rank == 0:
            write_tracker(root, step)
            keep = trainer.get("max_ckpt_to_keep")
            if keep:
                steps = sorted(step_of(d) for d in os.listdir(root) if d.startswith(STEP_PREFIX)
                               and not d.endswith(".partial"))
                for old in steps[:-int(keep)]:
                    shutil.rmtree(os.path.join(root, f"{STEP_PREFIX}{old}"), ignore_errors=True)
        return folder

    def fit(self) -> dict[str, float]:
        """Train to `trainer.total_training_steps` (else total_epochs); returns the last step's metrics."""
        from omegaconf import OmegaConf

        from verl.utils.fsdp_utils import memory_metrics
        from verl.utils.tracking import Tracking

        trainer = self.config.trainer
        tracking = Tracking(trainer.project_name, trainer.experiment_name, trainer.logger,
                            OmegaConf.to_container(self.config, resolve=True)) if self.rank == 0 else None
        metrics: dict[str, float] = {}
        test_freq, save_freq = (self.steps_per_epoch if value == EVERY_EPOCH else int(value)
                                for value in (trainer.test_freq, trainer.save_freq))
        for step in range(self._resume() + 1, self.total_steps + 1):
            start = time.perf_counter()
            metrics = self.train_step(self._rows_of_step(step))
            # upstream's PPO names for the step's time and the memory peaks, so the same tools read both
            metrics["timing_s/step"] = time.perf_counter() - start
            metrics.update(memory_metrics(self.plan.device_type))
            metrics["train/epoch"] = (step - 1) // self.steps_per_epoch
            last = step == self.total_steps
            if self.val_set is not None and (last or (test_freq > 0 and step % test_freq == 0)):
                metrics["val/loss"] = self.validate()
            if tracking is not None:
                tracking.log(data=metrics, step=step)
            if last or (save_freq > 0 and step % save_freq == 0):
                self.save(step)
        if not math.isfinite(metrics.get("train/loss", 0.0)):
            raise FloatingPointError(f"SFT ended with a non-finite loss ({metrics['train/loss']})")
        return metrics


def checked_plan(config):
    """The SFT plan of a config without problems (printed by rank 0); a config with problems lists them and
    exits with CONFIG_ERROR_EXIT before anything starts. Both launchers (torchrun, Ray) begin here."""
    from verl import compat
    from verl.compat.planning.sft import build_sft_plan

    problems = config_problems(config)
    if problems:
        print("verl: config error:\n" + "\n".join(f"- {p}" for p in problems), file=sys.stderr)
        raise SystemExit(CONFIG_ERROR_EXIT)
    plan = build_sft_plan(config)
    if int(os.environ.get("RANK", 0)) == 0:
        print(compat.format_plan(plan), flush=True)
    return plan


def fit_rank(config, plan, device_index: int | None = None) -> dict[str, float]:
    """Run this rank's SFT loop to the end and close its process group; returns its last-step metrics."""
    trainer = SFTTrainer(config, plan, device_index=device_index)
    try:
        return trainer.fit()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_sft(config) -> dict[str, float]:
    """Check, plan, train; returns the last step's metrics."""
    follow_launcher(config)
    return fit_rank(config, checked_plan(config))


def follow_launcher(config) -> None:
    """Under torchrun the ranks are the launcher's: its WORLD_SIZE and LOCAL_WORLD_SIZE become
    `trainer.nnodes` x `trainer.n_gpus_per_node` (upstream's torchrun scripts leave those at 1), so the plan
    shards for the processes that actually run. Rank 0 says so when the config named other numbers."""
    if "WORLD_SIZE" not in os.environ:
        return
    world = int(os.environ["WORLD_SIZE"])
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    nodes = max(world // per_node, 1)
    trainer = config.trainer
    asked = (trainer.get("n_gpus_per_node", 1), trainer.get("nnodes", 1))
    if asked == (per_node, nodes):
        return
    if int(os.environ.get("RANK", 0)) == 0 and asked != (1, 1):
        print(f"verl: torchrun started {world} ranks ({nodes} node(s) x {per_node}); trainer.nnodes x "
              f"trainer.n_gpus_per_node ({asked[1]} x {asked[0]}) follow it", file=sys.stderr, flush=True)
    trainer.n_gpus_per_node, trainer.nnodes = per_node, nodes


def main() -> None:
    import hydra

    hydra.main(config_path="config", config_name="sft_trainer_engine", version_base=None)(run_sft)()


if __name__ == "__main__":
    main()
