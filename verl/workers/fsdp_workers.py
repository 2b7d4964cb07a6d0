"""FSDP workers: the actor/rollout/reference policy and the critic, one process per device.

Each worker is driven by the single controller through `@register`-ed methods and receives the
compat `Plan`, which fixes dtypes, attention kernel, offload, checkpointing and the distributed
backend; nothing here looks at the hardware. Batch sizes follow upstream: `ppo_mini_batch_size`
counts prompts, is multiplied by `rollout.n` and divided by the data-parallel size; the
`*_micro_batch_size_per_gpu` keys and token budgets are per rank.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time

import torch
import torch.distributed as dist
from omegaconf import OmegaConf

from verl.compat import torch_dtype
from verl.compat.planning.throughput import peak_flops
from verl.protocol import DataProto
from verl.single_controller.base.decorator import Dispatch, register
from verl.single_controller.base.worker import Worker
from verl.utils import fsdp_utils, lora, ulysses
from verl.utils.checkpoint.fsdp_checkpoint_manager import FSDPCheckpointManager
from verl.utils.compile_beside import MODES as COMPILE_MODES
from verl.utils.compile_beside import BesideCompiler, PassInfo
from verl.utils.flops import training_flops
from verl.utils.startup.clock import Laps
from verl.utils.torch_functional import (
    get_constant_schedule_with_warmup,
    get_cosine_schedule_with_warmup,
)
from verl.workers.actor.dp_actor import DataParallelPPOActor, Precision
from verl.workers.critic.dp_critic import DataParallelPPOCritic
from verl.workers.model_building import frozen_weights, layer_compile
from verl.workers.model_building.loading import build_model, freeze_vision_tower, import_model_code, load_tokenizer

logger = logging.getLogger(__name__)

ROLES = ("actor", "rollout", "ref", "actor_rollout", "actor_rollout_ref")
# the Ulysses setting behind each role's sequence-parallel size (named in errors)
_SP_KEYS = {"actor": "actor_rollout_ref.actor.ulysses_sequence_parallel_size",
            "ref": "actor_rollout_ref.ref.ulysses_sequence_parallel_size",
            "critic": "critic.ulysses_sequence_parallel_size"}


# ---------------------------------------------------------------------------------------- helpers


@functools.lru_cache(maxsize=8)
def _process_tokenizer(path: str, trust_remote_code: bool):
    """One tokenizer per path and process: the colocated roles of a worker process (actor, critic)
    share it instead of each parsing tokenizer.json again (a second or more for a 150k vocabulary).
    Nothing in a worker changes a tokenizer after loading."""
    return load_tokenizer(path, trust_remote_code)


class _TokenizerOnUse:
    """The role's tokenizer, loaded on first use (a checkpoint save, a generate call whose meta_info lacks
    eos/pad ids). The trainer sends those ids with every generate call, so most runs only need it to
    save a checkpoint, and parsing a large vocabulary up front only delays the worker's start-up
    (figures: docs/performance.md, "Why the code does it this way")."""

    def __init__(self, path: str, trust_remote_code: bool):
        self._source = (path, trust_remote_code)

    def __getattr__(self, name):
        if name.startswith("__") or name == "_source":   # copy/pickle probes before __init__ ran
            raise AttributeError(name)
        return getattr(_process_tokenizer(*self._source), name)

    def __len__(self) -> int:
        return len(_process_tokenizer(*self._source))

    def save_pretrained(self, folder: str):
        """The tokenizer's files and, for a multimodal model, its processor's (a checkpoint's huggingface/)."""
        from verl.utils.tokenizer import copy_processor_files

        saved = _process_tokenizer(*self._source).save_pretrained(folder)
        copy_processor_files(self._source[0], folder)
        return saved


_MODEL_CODE_LOCK = threading.Lock()   # colocated roles share a process: their imports run one after the other


class _ModelCodeImport:
    """`import_model_code` on a thread, started as the constructor ends and awaited first thing in
    `init_model`: in between the worker is idle while the driver reads the data sets, and no other
    import runs beside it (two threads importing the same package at once can deadlock on its modules)."""

    def __init__(self, model_config):
        args = (model_config.path, bool(model_config.get("trust_remote_code", False)))
        self._thread = threading.Thread(target=self._run, args=args, name="verl-model-code", daemon=True)
        self._thread.start()

    @staticmethod
    def _run(path: str, trust_remote_code: bool) -> None:
        try:
            with _MODEL_CODE_LOCK:
                import_model_code(path, trust_remote_code)
        except Exception:  # noqa: BLE001 - build_model meets the same problem on the main thread and reports it
            logger.debug("importing the model code ahead of init_model failed", exc_info=True)

    def wait(self) -> None:
        self._thread.join()


def _copy_config(config):
    """A private, resolved, writable copy: the worker rescales batch sizes in it."""
    return OmegaConf.create(OmegaConf.to_container(config, resolve=True))


def _unset(value) -> bool:
    return value is None or value == "auto"


def _per_rank(cfg, global_key: str, per_gpu_key: str, dp_size: int, plan_value) -> None:
    """Upstream's deprecated global micro-batch key divided by dp, else the per-rank key, else the plan."""
    if not _unset(cfg.get(global_key)):
        cfg[per_gpu_key] = max(1, int(cfg[global_key]) // dp_size)
    elif _unset(cfg.get(per_gpu_key)):
        cfg[per_gpu_key] = plan_value


def _fill(cfg, key: str, plan_value) -> None:
    if _unset(cfg.get(key)):
        cfg[key] = plan_value


def _normalize_mini_batch(cfg, rollout_n: int, dp_size: int, where: str) -> None:
    """Prompts -> sequences (x rollout.n) -> this rank's share (/ dp); checks divisibility as upstream."""
    global_sequences = int(cfg.ppo_mini_batch_size) * rollout_n
    if global_sequences % dp_size:
        raise ValueError(
            f"{where}.ppo_mini_batch_size ({cfg.ppo_mini_batch_size}) x rollout.n ({rollout_n}) = {global_sequences} "
            f"sequences cannot be split evenly over {dp_size} data-parallel ranks; make it a multiple of {dp_size}."
        )
    cfg.ppo_mini_batch_size = global_sequences // dp_size
    if not cfg.get("use_dynamic_bsz", False):
        micro = cfg.get("ppo_micro_batch_size_per_gpu")
        if _unset(micro):
            raise ValueError(f"set {where}.ppo_micro_batch_size_per_gpu (or use_dynamic_bsz=True)")
        if cfg.ppo_mini_batch_size % int(micro):
            raise ValueError(
                f"{where}: per-rank mini-batch of {cfg.ppo_mini_batch_size} sequences is not a multiple of "
                f"ppo_micro_batch_size_per_gpu={micro}; pick a micro-batch size that divides it."
            )


def _build_optimizer(module: torch.nn.Module, optim_cfg, fused: bool = False, eight_bit: bool = False):
    """AdamW over the trainable parameters (all of them, or a LoRA model's adapters) plus upstream's
    warm-up / constant|cosine schedule (stepped once per update call).

    The plan picks the kernel: bitsandbytes' AdamW8bit (`optimizer_8bit`: moments in 8 bits), torch's
    fused AdamW (`fused_optimizer`; torch builds it for accelerators and, from 2.4, for the host, where an
    offloaded role's shards step), or torch's default."""
    betas = tuple(optim_cfg.get("betas", (0.9, 0.999)))
    params = [p for p in module.parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameters; check actor_rollout_ref.model.target_modules / "
                         "exclude_modules (LoRA) match some of its layers")
    kwargs = dict(lr=float(optim_cfg.lr), betas=betas, weight_decay=float(optim_cfg.get("weight_decay", 0.01)))
    if eight_bit:
        try:
            import bitsandbytes
        except ImportError as err:
            raise ImportError("optim.optimizer_impl=bitsandbytes.optim needs bitsandbytes: pip install 'verl[bnb]'") \
                from err
        optimizer = bitsandbytes.optim.AdamW8bit(params, **kwargs)
    else:
        optimizer = torch.optim.AdamW(params, fused=True if fused else None, **kwargs)
    total_steps = int(optim_cfg.get("total_training_steps", -1) or -1)
    warmup = optim_cfg.get("lr_warmup_steps", -1)
    if warmup is None or int(warmup) <= 0:
        warmup = int(float(optim_cfg.get("lr_warmup_steps_ratio", 0.0) or 0.0) * max(total_steps, 0))
    style = optim_cfg.get("warmup_style") or optim_cfg.get("lr_scheduler_type", "constant") or "constant"
    if style == "constant":
        scheduler = get_constant_schedule_with_warmup(optimizer, num_warmup_steps=int(warmup))
    elif style == "cosine":
        if total_steps <= 0:
            raise ValueError("a cosine LR schedule needs optim.total_training_steps (the trainer injects it)")
        scheduler = get_cosine_schedule_with_warmup(
            optimizer,
            num_warmup_steps=int(warmup),
            num_training_steps=total_steps,
            min_lr_ratio=float(optim_cfg.get("min_lr_ratio", 0.0) or 0.0),
            num_cycles=float(optim_cfg.get("num_cycles", 0.5)),
            zero_indexed_step=bool(optim_cfg.get("zero_indexed_step", True)),
        )
    else:
        raise ValueError(f"unknown lr_scheduler_type {style!r}; use constant or cosine")
    return optimizer, scheduler


class _PlannedModel:
    """One model of a worker, set up exactly as its role plan says: param and compute dtypes, FSDP
    casting on gather and reduce dtype, grad scaler, offload, and whether the numerics guard runs.

    Nothing here is decided: a role plan re-issued at run time (the guard failed, see
    `verl.compat.apply.precision`) is put in force with `apply`.
    """

    def __init__(self, name: str, role_plan, device_type: str):
        if role_plan.use_remove_padding and role_plan.attn_implementation in ("sdpa", "eager"):
            logger.warning("%s: packed sequences with %s attention use a dense block-diagonal mask over the whole "
                           "packed row: correct, but attention costs more than in the padded batch",
                           name, role_plan.attn_implementation)
        self.name = name
        self.device_type = device_type
        self.param_dtype = torch_dtype(role_plan.param_dtype)
        self.optimizer_offload = role_plan.optimizer_offload
        self.guard_pending = role_plan.numerics_guard
        self.precision = Precision(device_type)
        self.apply(role_plan)

    def apply(self, role_plan) -> None:
        """Compute in the role plan's dtype (autocast for any half dtype) with its grad scaler, if any."""
        self.role_plan = role_plan
        self.guard_pending = self.guard_pending and role_plan.numerics_guard
        self.compute_dtype = torch_dtype(role_plan.compute_dtype)
        self.precision.autocast_dtype = None if self.compute_dtype == torch.float32 else self.compute_dtype
        if not role_plan.grad_scaler:
            self.precision.scaler = None
        elif self.precision.scaler is None:
            self.precision.scaler = torch.amp.GradScaler(self.device_type)

    def shard(self, module: torch.nn.Module, compile_layers: bool = False, compiler=None) -> torch.nn.Module:
        """FSDP2 units per the role plan (or, where the plan says `fsdp` False, the model unwrapped on
        the device); with `compile_layers` (the plan's torch_compile, for a model that trains or
        scores) each decoder layer's forward is compiled first, outside FSDP2's hooks, and run
        compiled when `compiler` (a BesideCompiler, or None: from the first call) says so."""
        plan = self.role_plan
        if compile_layers:
            layer_compile.compile_decoder_layers(module, backend=layer_compile.BACKEND, compiler=compiler)
        if not plan.fsdp:
            if _ranks() > 1:   # unwrapped replicas would train apart, each on its own share of the batch
                raise RuntimeError(
                    f"{self.name}: the plan runs this model unwrapped, as for one device, but {_ranks()} ranks are "
                    f"running; plan with trainer.n_gpus_per_node x trainer.nnodes = {_ranks()}")
            module = fsdp_utils.place_unwrapped(module, self.device_type)
            frozen_weights.upcast_frozen(module)
            return module
        if plan.base_quantization is not None:
            raise NotImplementedError(f"{self.name}: a 4-bit base (actor_rollout_ref.model.load_in_4bit) runs on one "
                                      "device, unwrapped; this plan wraps the model in FSDP2 (more than one device "
                                      "or offload). Use one GPU without offload, or load_in_4bit=false.")
        module = fsdp_utils.shard_model(
            module,
            param_dtype=self.param_dtype,
            compute_dtype=self.compute_dtype,
            cast_params_for_compute=plan.cast_on_gather,
            reduce_dtype=torch_dtype(plan.reduce_dtype),
            param_offload=plan.param_offload,
            device_type=self.device_type,
            reshard_after_forward=plan.reshard_after_forward,
        )
        if compile_layers:
            layer_compile.trace_as_plain_modules(module)
        return module

    def place_optimizer(self, optimizer: torch.optim.Optimizer, device: torch.device) -> None:
        """With the plan's optimizer offload, the state is on `device` only during each optimizer step;
        with its param offload the step runs on the host shards, with every host core."""
        if self.optimizer_offload:
            fsdp_utils.offload_optimizer_state(optimizer, device)
        if self.role_plan.param_offload and self.device_type != "cpu":
            fsdp_utils.step_on_all_host_cores(optimizer)

    def check_numerics(self, module: torch.nn.Module, batch: dict) -> str | None:
        """On the first real batch, compare the compute dtype with float32 on a few of its rows (that
        batch may be the whole validation set); the reason when it fails (None otherwise). Every
        data-parallel rank gets the same verdict and reason."""
        if not self.guard_pending:
            return None
        self.guard_pending = False
        from verl.compat.apply import numerics

        sample = _same_row_count_on_every_rank(numerics.guard_sample(batch, numerics.GUARD_ROWS))
        ok, reason = _agreed_verdict(*numerics.check_half_precision(module, sample, self.compute_dtype))
        return None if ok else reason


def _ranks() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _agreed_min(code: int) -> int:
    """The smallest of the ranks' codes (a host tensor: the gloo side of the process group)."""
    value = torch.tensor([code], dtype=torch.int64)
    dist.all_reduce(value, op=dist.ReduceOp.MIN)
    return int(value)


def _compiler(plan) -> BesideCompiler | None:
    """The process's switch between eager and compiled code (verl/utils/compile_beside.py), per the plan's
    compile_warmup; None where nothing is compiled. Every rank switches at the same pass."""
    if not plan.torch_compile:
        return None
    mode = plan.compile_warmup if plan.compile_warmup in COMPILE_MODES else "synchronous"
    return BesideCompiler(mode, agree=_agreed_min if _ranks() > 1 else None)


def _compile_pass(compiler: BesideCompiler | None, name: str):
    """A worker call as one pass of `compiler` (the switch to compiled code happens only between passes)."""
    return contextlib.nullcontext(PassInfo()) if compiler is None else compiler.pass_(name)


def _compiled_metric(info: PassInfo, name: str) -> dict:
    """perf/compiled_layers/<pass>: 1 where the pass ran compiled code, 0 where it ran eager code still
    being built (the trainer's perf/compiled_layers is their minimum over the step); perf/compile_s/<pass>:
    seconds torch.compile ran during the pass (the trainer's perf/compile_s is their sum)."""
    metrics = {} if info.compiled is None else {f"perf/compiled_layers/{name}": float(info.compiled)}
    if info.compile_s is not None:
        metrics[f"perf/compile_s/{name}"] = info.compile_s
    return metrics


def _same_row_count_on_every_rank(sample: dict) -> dict:
    """The guard runs two forwards per row and, with sharded weights, every forward is a collective:
    ranks whose samples are shorter (smaller chunk, padding rows skipped) repeat their rows."""
    if _ranks() == 1:
        return sample
    rows = sample["input_ids"].shape[0]
    most = torch.tensor([rows], dtype=torch.int64, device=sample["input_ids"].device)
    dist.all_reduce(most, op=dist.ReduceOp.MAX)
    if int(most) == rows:
        return sample
    index = torch.arange(int(most), device=most.device) % rows
    return {k: [v[i] for i in index.tolist()] if isinstance(v, list) else v[index] for k, v in sample.items()}


def _agreed_verdict(ok: bool, reason: str) -> tuple[bool, str]:
    """One precision for the whole data-parallel group: if any rank's sample fails, all fall back,
    with the first failing rank's reason (so every rank re-issues the same plan)."""
    if _ranks() == 1:
        return ok, reason
    verdicts: list = [None] * _ranks()
    dist.all_gather_object(verdicts, (ok, reason))
    failed = [(rank, why) for rank, (passed, why) in enumerate(verdicts) if not passed]
    if not failed:
        return ok, reason
    rank, why = failed[0]
    return False, f"rank {rank}'s sample: {why}"


def _reissue(plan, role: str, reason: str, updates: list[dict]):
    """The plan after `role`'s guard failed (decided by verl.compat.apply.precision), logged and kept for
    the outputs' meta_info, where the trainer re-issues its own copy from `role` and `reason`."""
    from verl.compat.apply.precision import describe, guard_fallback

    plan, changes = guard_fallback(plan, role, reason)
    line = describe(changes, reason)
    logger.warning(line)
    updates.append({"role": role, "reason": reason, "line": line})
    return plan


def _with_plan_updates(meta: dict, updates: list[dict]) -> dict:
    """Every output carries the plan updates so far (the trainer applies each once)."""
    if updates:
        meta["compat_plan_updates"] = [dict(u) for u in updates]
        meta["compat_notes"] = [u["line"] for u in updates]
    return meta


def _checkpoint_manager(planned: _PlannedModel, module, optimizer, scheduler, tokenizer, checkpoint_config):
    return FSDPCheckpointManager(module, optimizer, scheduler, tokenizer, checkpoint_config,
                                 scaler=planned.precision.scaler, device_type=planned.device_type,
                                 optimizer_offload=planned.optimizer_offload)


def _mfu(role: str, module, plan, compute_dtype: torch.dtype, data: DataProto, epochs: int, seconds: float,
         lm_head: bool) -> dict:
    """Upstream's perf/mfu/<role>: this rank's model FLOPs of the update over its time and the plan's
    device peak (the trainer averages ranks). Left out where the profile gives no peak rate (CPU)."""
    peak = peak_flops(plan.device, str(compute_dtype).removeprefix("torch."))
    config = getattr(module, "config", None)
    if peak <= 0 or seconds <= 0 or config is None:
        return {}
    seq_lens = data.batch["attention_mask"].sum(dim=-1).tolist()
    flops = epochs * training_flops(config, seq_lens, lm_head=lm_head)
    return {f"perf/mfu/{role}": flops / seconds / peak}


def _model_inputs(data: DataProto) -> dict:
    inputs = {k: data.batch[k] for k in ("input_ids", "attention_mask", "position_ids")}
    if "multi_modal_inputs" in data.non_tensor_batch:   # a VL batch: the numerics guard checks the tower too
        inputs["multi_modal_inputs"] = data.non_tensor_batch["multi_modal_inputs"]
    return inputs


def _gathered_for_forward(module, role_plan):
    """The role plan's `gather_for_forward`: a forward-only call holds the whole model gathered once
    (`fsdp_utils.full_params`) instead of FSDP2 gathering each layer for every micro-batch."""
    if role_plan is not None and role_plan.gather_for_forward:
        return fsdp_utils.full_params(module)
    return contextlib.nullcontext()


def _output(meta_info: dict | None = None, **tensors) -> DataProto:
    return DataProto.from_dict(tensors=tensors or None, meta_info=meta_info or {})


# ---------------------------------------------------------------------------------------- actor


class ActorRolloutRefWorker(Worker):
    """The policy in any of upstream's roles: actor, rollout, ref, actor_rollout, actor_rollout_ref.

    `config` is the `actor_rollout_ref` config. With a rollout role the rollout engine generates
    with the actor's own (sharded) weights; with `actor_rollout_ref` a separate frozen reference copy
    is loaded, as upstream does.
    """

    def __init__(self, config, role: str, plan=None):
        super().__init__()
        self._laps = Laps(from_process_start=True)
        if role not in ROLES:
            raise ValueError(f"role must be one of {ROLES}, got {role!r}")
        if plan is None:
            raise ValueError("ActorRolloutRefWorker needs the compat plan: pass plan=verl.compat.build_plan(config)")
        from verl.compat.apply.apply_plan import apply_in_process

        self.device = apply_in_process(plan, self.device_index)
        self.plan = plan
        self.role = role
        self._is_actor = role in ("actor", "actor_rollout", "actor_rollout_ref")
        self._is_rollout = role in ("rollout", "actor_rollout", "actor_rollout_ref")
        self._is_ref = role in ("ref", "actor_rollout_ref")
        self._actor_model = self._ref_model = None
        self._plan_updates: list[dict] = []
        _, world = fsdp_utils.init_distributed(plan.dist_backend)
        self._compiler = _compiler(plan)
        # Ulysses groups (None without sequence parallelism); data-parallel size = ranks / sp
        self._actor_sp = ulysses.sequence_parallel_group(plan.actor.sequence_parallel_size, _SP_KEYS["actor"])
        self._ref_sp = ulysses.sequence_parallel_group((plan.ref or plan.actor).sequence_parallel_size,
                                                       _SP_KEYS["ref"])
        self.dp_size = world // ulysses.group_size(self._actor_sp)
        self._ref_dp_size = world // ulysses.group_size(self._ref_sp)
        self.config = _copy_config(config)
        self._normalize_batch_sizes()
        self._model_code = _ModelCodeImport(self.config.model)
        self._laps("constructor")

    def _normalize_batch_sizes(self) -> None:
        cfg, dp, n = self.config, self.dp_size, int(self.config.rollout.get("n", 1))
        ref_plan = self.plan.ref or self.plan.actor
        if self._is_actor:
            a, p = cfg.actor, self.plan.actor
            _fill(a, "use_dynamic_bsz", p.use_dynamic_bsz)
            _per_rank(a, "ppo_micro_batch_size", "ppo_micro_batch_size_per_gpu", dp, p.micro_batch_size_per_gpu)
            _fill(a, "ppo_max_token_len_per_gpu", p.max_token_len_per_gpu)
            _normalize_mini_batch(a, n, dp, "actor_rollout_ref.actor")
        if self._is_actor or self._is_rollout:
            r, p = cfg.rollout, self.plan.actor
            _fill(r, "log_prob_use_dynamic_bsz", p.use_dynamic_bsz)
            _per_rank(r, "log_prob_micro_batch_size", "log_prob_micro_batch_size_per_gpu", dp,
                      p.forward_micro_batch_size_per_gpu or p.micro_batch_size_per_gpu)
            _fill(r, "log_prob_max_token_len_per_gpu", p.forward_max_token_len_per_gpu or p.max_token_len_per_gpu)
        if self._is_ref:
            r = cfg.ref
            _fill(r, "log_prob_use_dynamic_bsz", ref_plan.use_dynamic_bsz)
            _per_rank(r, "log_prob_micro_batch_size", "log_prob_micro_batch_size_per_gpu", self._ref_dp_size,
                      ref_plan.forward_micro_batch_size_per_gpu or ref_plan.micro_batch_size_per_gpu)
            _fill(r, "log_prob_max_token_len_per_gpu",
                  ref_plan.forward_max_token_len_per_gpu or ref_plan.max_token_len_per_gpu)

    # ------------------------------------------------------------------ building

    def _load(self, planned: _PlannedModel, train: bool, laps: Laps, compile_layers: bool) -> torch.nn.Module:
        """The role's model per its plan; with a LoRA plan, the adapters are added before sharding."""
        model_cfg = self.config.model
        module = build_model(
            model_cfg.path,
            planned.role_plan,
            trust_remote_code=bool(model_cfg.get("trust_remote_code", False)),
            override_config=model_cfg.get("override_config") or {},
            train=train,
        )
        if train and planned.name == "actor" and self.config.actor.get("freeze_vision_tower", False):
            freeze_vision_tower(module)
        if planned.role_plan.lora_rank > 0:
            module = lora.add_adapters(module, model_cfg, planned.role_plan.lora_rank, planned.param_dtype)
        elif model_cfg.get("lora_adapter_path") and planned.name == "actor":
            raise ValueError("actor_rollout_ref.model.lora_adapter_path is set but lora_rank is 0: set "
                             "actor_rollout_ref.model.lora_rank to the adapter's rank to continue training it")
        ulysses.install(module, planned.role_plan.sequence_parallel_size, _SP_KEYS[planned.name])
        laps(f"{planned.name}_load")
        module = planned.shard(module, compile_layers, self._compiler)
        laps(f"{planned.name}_shard")
        return module

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self, total_training_steps: int | None = None) -> dict[str, float]:
        """Load, shard and wrap every model of this role; returns the seconds each piece took.

        `total_training_steps` sizes the LR schedule when the worker was started before the driver knew
        it (the data set is filtered while the workers start); else the config's value is used."""
        laps = self._laps
        laps.restart()
        self._model_code.wait()
        laps("model_code")
        if total_training_steps is not None and self._is_actor:
            self.config.actor.optim.total_training_steps = int(total_training_steps)
        model_cfg = self.config.model
        self.tokenizer = _TokenizerOnUse(model_cfg.get("tokenizer_path") or model_cfg.path,
                                         bool(model_cfg.get("trust_remote_code", False)))
        self.actor = self.rollout = self.ref_policy = None
        self.multi_turn = None
        self.actor_optimizer = self.actor_lr_scheduler = None
        if self._is_actor or self._is_rollout:
            self._actor_model = _PlannedModel("actor", self.plan.actor, self.plan.device_type)
            # compiled where it trains and scores; a rollout-only role only generates (eager)
            self.actor_module = self._load(self._actor_model, train=self._is_actor, laps=laps,
                                           compile_layers=self.plan.torch_compile and self._is_actor)
            if self._is_actor:
                self.actor_optimizer, self.actor_lr_scheduler = _build_optimizer(
                    self.actor_module, self.config.actor.optim, self.plan.actor.fused_optimizer,
                    self.plan.actor.optimizer_8bit)
                self._actor_model.place_optimizer(self.actor_optimizer, self.device)
                laps("actor_optimizer")
            actor_cfg = self.config.actor if self._is_actor else self.config.rollout
            self.actor = DataParallelPPOActor(actor_cfg, self.actor_module, self.actor_optimizer,
                                              precision=self._actor_model.precision,
                                              use_remove_padding=self.plan.actor.use_remove_padding,
                                              use_torch_compile=self.plan.torch_compile,
                                              compile_backend=layer_compile.BACKEND, sp_group=self._actor_sp,
                                              compiler=self._compiler)
            if self._is_actor:
                self.checkpoint_manager = _checkpoint_manager(self._actor_model, self.actor_module,
                                                              self.actor_optimizer, self.actor_lr_scheduler,
                                                              self.tokenizer, self.config.actor.get("checkpoint"))
            laps("actor_wrap")
        if self._is_rollout:
            self.rollout = self._build_rollout()
            if (self.config.rollout.get("multi_turn") or {}).get("enable", False):
                from verl.workers.rollout.multi_turn import MultiTurnRollout

                # turn by turn over the same engine; tools load here, in the worker that runs them
                self.multi_turn = MultiTurnRollout(self.rollout, self.tokenizer, self.config.rollout)
            if self._is_actor and hasattr(self.rollout, "get_rng_state"):
                # an engine with its own sampling stream: checkpoint it, so a resumed run samples alike
                self.checkpoint_manager.sampling_streams["rollout"] = self.rollout
            laps("rollout_engine")
        if self._is_ref and self.plan.ref_in_actor:
            if self.actor is None:
                raise RuntimeError("the plan serves the reference from the LoRA actor (plan.ref_in_actor) but role "
                                   f"{self.role!r} holds no actor; use actor_rollout_ref")
            self.ref_module, self.ref_policy = self.actor_module, self.actor   # adapters off: see compute_ref_log_prob
        elif self._is_ref:
            self._ref_model = _PlannedModel("ref", self.plan.ref or self.plan.actor, self.plan.device_type)
            self.ref_module = self._load(self._ref_model, train=False, laps=laps,
                                         compile_layers=self.plan.torch_compile)
            self.ref_policy = DataParallelPPOActor(self.config.ref, self.ref_module, precision=self._ref_model.precision,
                                                   use_remove_padding=self._ref_model.role_plan.use_remove_padding,
                                                   use_torch_compile=self.plan.torch_compile,
                                                   compile_backend=layer_compile.BACKEND, sp_group=self._ref_sp,
                                                   compiler=self._compiler)
        return laps.seconds

    def _build_rollout(self):
        from verl.workers.rollout import ENGINES

        name = self.plan.rollout.name
        if name not in ENGINES:  # the planner picks only listed engines; a hand-made plan can still miss
            raise ValueError(f"rollout engine {name!r} is not one of this verl's engines {sorted(ENGINES)}; "
                             "set actor_rollout_ref.rollout.name to one of them (or auto)")
        extra = {"compiler": self._compiler} if name == "hf" else {}   # the built-in engine's compiled decode step
        return ENGINES[name](self.actor_module, self.config.rollout, plan=self.plan, **extra)

    def _perf_metrics(self) -> dict:
        metrics = fsdp_utils.memory_metrics(self.plan.device_type)
        metrics["perf/predicted_peak_gb"] = self.plan.predicted_peak_gb
        return metrics

    def _guard(self, planned: _PlannedModel, module, data: DataProto) -> None:
        """Run `planned`'s numerics guard if pending; when it fails, re-issue the plan and apply it."""
        reason = planned.check_numerics(module, _model_inputs(data))
        if reason is not None:
            self.plan = _reissue(self.plan, planned.name, reason, self._plan_updates)
            if self._actor_model is not None:
                self._actor_model.apply(self.plan.actor)
            if self._ref_model is not None:
                self._ref_model.apply(self.plan.ref or self.plan.actor)
            if self.rollout is not None:
                self.rollout.dtype = torch_dtype(self.plan.rollout.dtype)

    # ------------------------------------------------------------------ methods

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Sample responses with the actor's weights (gathered once, so ranks may stop at different steps)."""
        if self.rollout is None:
            raise RuntimeError(f"role {self.role!r} has no rollout; use actor_rollout or actor_rollout_ref")
        prompts = prompts.to(self.device)
        for key in ("eos_token_id", "pad_token_id"):   # the tokenizer loads only when the caller sent no id
            if key not in prompts.meta_info:
                prompts.meta_info[key] = getattr(self.tokenizer, key)
        self._guard(self._actor_model, self.actor_module, prompts)
        phase = "validation" if prompts.meta_info.get("validate", False) else "gen"
        # No autocast here: the engine alone runs in the plan's rollout dtype (it also sets eval mode).
        with _compile_pass(self._compiler, phase) as compiled, \
                fsdp_utils.phase_peak(self.plan.device_type, phase) as peaks, torch.no_grad(), \
                fsdp_utils.full_params(self.actor_module):
            output = (self.multi_turn or self.rollout).generate_sequences(prompts)
        output = output.to("cpu")
        metrics = output.meta_info.get("metrics") or {}
        metrics.update(peaks)
        metrics.update(_compiled_metric(compiled, phase))
        metrics.update(self._perf_metrics())
        output.meta_info["metrics"] = metrics
        _with_plan_updates(output.meta_info, self._plan_updates)
        return output

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_log_prob(self, data: DataProto) -> DataProto:
        """old_log_probs and entropys of the responses under the current actor."""
        if self.actor is None:
            raise RuntimeError(f"role {self.role!r} holds no actor weights; compute_log_prob needs actor or rollout")
        data, rows = ulysses.share_rows(data, self._actor_sp)
        log_probs, entropys, meta = self._score(data, self.config.rollout, self._actor_model, self.actor_module,
                                                self.actor, self.plan.actor, "old_log_prob", entropy=True)
        meta["temperature"] = float(self.config.rollout.get("temperature", 1.0))
        return _output(meta, old_log_probs=log_probs[rows].cpu(), entropys=entropys[rows].cpu())

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_ref_log_prob(self, data: DataProto) -> DataProto:
        """ref_log_prob of the responses under the frozen reference policy: the reference model, or, where
        the plan serves it from the LoRA actor (`ref_in_actor`), the actor with its adapters disabled."""
        if self.ref_policy is None:
            raise RuntimeError(f"role {self.role!r} has no reference policy; use ref or actor_rollout_ref")
        data, rows = ulysses.share_rows(data, self._actor_sp if self.plan.ref_in_actor else self._ref_sp)
        if self.plan.ref_in_actor:
            with lora.adapters_disabled(self.actor_module):
                log_probs, _, meta = self._score(data, self.config.ref, self._actor_model, self.actor_module,
                                                 self.actor, self.plan.actor, "ref", entropy=False)
        else:
            log_probs, _, meta = self._score(data, self.config.ref, self._ref_model, self.ref_module,
                                             self.ref_policy, self.plan.ref, "ref", entropy=False)
        return _output(meta, ref_log_prob=log_probs[rows].cpu())

    def _score(self, data: DataProto, cfg, planned: _PlannedModel, module, policy, role_plan, phase: str,
               entropy: bool):
        """One forward-only pass of `policy` over `data` with `cfg`'s log-prob micro-batching (the rollout's
        section for the actor, `ref` for the reference): (log_probs, entropys or None, meta_info)."""
        data = data.to(self.device)
        data.meta_info["micro_batch_size"] = cfg.log_prob_micro_batch_size_per_gpu
        data.meta_info["max_token_len"] = cfg.log_prob_max_token_len_per_gpu
        data.meta_info["use_dynamic_bsz"] = bool(cfg.get("log_prob_use_dynamic_bsz", False))
        data.meta_info["temperature"] = float(self.config.rollout.get("temperature", 1.0))
        self._guard(planned, module, data)
        with _compile_pass(self._compiler, phase) as compiled, \
                fsdp_utils.phase_peak(self.plan.device_type, phase) as peaks, _gathered_for_forward(module, role_plan):
            log_probs, entropys = policy.compute_log_prob(data, calculate_entropy=entropy)
        metrics = {**peaks, **self._perf_metrics(), **_compiled_metric(compiled, phase)}
        meta = _with_plan_updates({"metrics": metrics}, self._plan_updates)
        return log_probs, entropys, meta

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def update_actor(self, data: DataProto) -> DataProto:
        """PPO epochs over the batch; metrics in meta_info["metrics"] with upstream's names."""
        if not self._is_actor:
            raise RuntimeError(f"role {self.role!r} is not an actor")
        own = data   # this rank's rows: its share of the model FLOPs
        data = ulysses.share_rows(data, self._actor_sp)[0].to(self.device)
        data.meta_info.setdefault("temperature", float(self.config.rollout.get("temperature", 1.0)))
        self._guard(self._actor_model, self.actor_module, data)
        start = time.perf_counter()
        with _compile_pass(self._compiler, "update_actor") as compiled, \
                fsdp_utils.phase_peak(self.plan.device_type, "update_actor") as peaks:
            metrics = self.actor.update_policy(data)
        metrics.update(peaks)
        metrics.update(_compiled_metric(compiled, "update_actor"))
        metrics.update(_mfu("actor", self.actor_module, self.plan, self._actor_model.compute_dtype, own,
                            int(self.config.actor.get("ppo_epochs", 1)), time.perf_counter() - start, lm_head=True))
        metrics["actor/lr"] = self.actor_lr_scheduler.get_last_lr()[0]
        self.actor_lr_scheduler.step()
        metrics.update(self._perf_metrics())
        return _output(_with_plan_updates({"metrics": metrics}, self._plan_updates))


    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, local_path: str, hdfs_path: str | None = None, global_step: int = 0,
                        max_ckpt_to_keep: int | None = None) -> None:
        """The actor's model, optimizer and extra state as per-rank shards (see docs/checkpoints.md)."""
        self._require_actor("save_checkpoint")
        self.checkpoint_manager.save_checkpoint(local_path, hdfs_path, global_step, max_ckpt_to_keep)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, local_path: str, hdfs_path: str | None = None, del_local_after_load: bool = False):
        self._require_actor("load_checkpoint")
        self.checkpoint_manager.load_checkpoint(local_path, hdfs_path, del_local_after_load)

    def _require_actor(self, method: str) -> None:
        if not self._is_actor:
            raise RuntimeError(f"{method}: role {self.role!r} holds no trained weights; checkpoints belong to the actor")


# ---------------------------------------------------------------------------------------- critic


class CriticWorker(Worker):
    """The value function (a one-label token classifier); `config` is the `critic` config."""

    def __init__(self, config, plan=None):
        super().__init__()
        self._laps = Laps(from_process_start=True)
        if plan is None:
            raise ValueError("CriticWorker needs the compat plan: pass plan=verl.compat.build_plan(config)")
        if plan.critic is None:
            raise ValueError("the compat plan has no critic role (plan.critic is None) but a CriticWorker was built")
        if plan.critic.lora_rank > 0:
            raise NotImplementedError("LoRA on the critic (critic.model.lora_rank > 0) is not built: its value head "
                                      "would have to train beside the adapters; set critic.model.lora_rank=0")
        from verl.compat.apply.apply_plan import apply_in_process

        self.device = apply_in_process(plan, self.device_index)
        self.plan = plan
        self._plan_updates: list[dict] = []
        _, world = fsdp_utils.init_distributed(plan.dist_backend)
        self._compiler = _compiler(plan)
        self._sp = ulysses.sequence_parallel_group(plan.critic.sequence_parallel_size, _SP_KEYS["critic"])
        self.dp_size = world // ulysses.group_size(self._sp)
        self.config = _copy_config(config)
        c, p, dp = self.config, plan.critic, self.dp_size
        _fill(c, "use_dynamic_bsz", p.use_dynamic_bsz)
        _per_rank(c, "ppo_micro_batch_size", "ppo_micro_batch_size_per_gpu", dp, p.micro_batch_size_per_gpu)
        _per_rank(c, "forward_micro_batch_size", "forward_micro_batch_size_per_gpu", dp,
                  p.forward_micro_batch_size_per_gpu or c.get("ppo_micro_batch_size_per_gpu"))
        _fill(c, "ppo_max_token_len_per_gpu", p.max_token_len_per_gpu)
        _fill(c, "forward_max_token_len_per_gpu", p.forward_max_token_len_per_gpu or c.get("ppo_max_token_len_per_gpu"))
        _normalize_mini_batch(c, int(c.get("rollout_n", 1) or 1), dp, "critic")
        self._model_code = _ModelCodeImport(c.model)
        self._laps("constructor")

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self, total_training_steps: int | None = None) -> dict[str, float]:
        """Load, shard and wrap the value model; returns the seconds each piece took.
        `total_training_steps`: as ActorRolloutRefWorker.init_model."""
        laps = self._laps
        laps.restart()
        self._model_code.wait()
        laps("model_code")
        if total_training_steps is not None:
            self.config.optim.total_training_steps = int(total_training_steps)
        model_cfg = self.config.model
        trust = bool(model_cfg.get("trust_remote_code", False))
        self.tokenizer = _TokenizerOnUse(model_cfg.get("tokenizer_path") or model_cfg.path, trust)
        self._critic_model = _PlannedModel("critic", self.plan.critic, self.plan.device_type)
        module = build_model(model_cfg.path, self.plan.critic, value_head=True, trust_remote_code=trust,
                             override_config=model_cfg.get("override_config") or {}, train=True)
        ulysses.install(module, self.plan.critic.sequence_parallel_size, _SP_KEYS["critic"])
        laps("critic_load")
        self.critic_module = self._critic_model.shard(module, compile_layers=self.plan.torch_compile,
                                                      compiler=self._compiler)
        laps("critic_shard")
        self.critic_optimizer, self.critic_lr_scheduler = _build_optimizer(
            self.critic_module, self.config.optim, self.plan.critic.fused_optimizer, self.plan.critic.optimizer_8bit)
        self._critic_model.place_optimizer(self.critic_optimizer, self.device)
        laps("critic_optimizer")
        self.critic = DataParallelPPOCritic(self.config, self.critic_module, self.critic_optimizer,
                                            precision=self._critic_model.precision,
                                            use_remove_padding=self.plan.critic.use_remove_padding,
                                            sp_group=self._sp)
        self.checkpoint_manager = _checkpoint_manager(self._critic_model, self.critic_module, self.critic_optimizer,
                                                      self.critic_lr_scheduler, self.tokenizer,
                                                      self.config.get("checkpoint"))
        return laps.seconds

    def _meta(self, metrics: dict) -> dict:
        metrics.update(fsdp_utils.memory_metrics(self.plan.device_type))
        metrics["perf/predicted_peak_gb"] = self.plan.predicted_peak_gb
        return _with_plan_updates({"metrics": metrics}, self._plan_updates)

    def _guard(self, data: DataProto) -> None:
        reason = self._critic_model.check_numerics(self.critic_module, _model_inputs(data))
        if reason is not None:
            self.plan = _reissue(self.plan, "critic", reason, self._plan_updates)
            self._critic_model.apply(self.plan.critic)

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_values(self, data: DataProto) -> DataProto:
        data, rows = ulysses.share_rows(data, self._sp)
        data = data.to(self.device)
        data.meta_info["micro_batch_size"] = self.config.forward_micro_batch_size_per_gpu
        data.meta_info["max_token_len"] = self.config.forward_max_token_len_per_gpu
        self._guard(data)
        with _compile_pass(self._compiler, "values") as compiled, \
                fsdp_utils.phase_peak(self.plan.device_type, "values") as peaks, \
                _gathered_for_forward(self.critic_module, self.plan.critic):
            values = self.critic.compute_values(data)
        return _output(self._meta({**peaks, **_compiled_metric(compiled, "values")}), values=values[rows].cpu())

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def update_critic(self, data: DataProto) -> DataProto:
        own = data   # this rank's rows: its share of the model FLOPs
        data = ulysses.share_rows(data, self._sp)[0].to(self.device)
        self._guard(data)
        start = time.perf_counter()
        with _compile_pass(self._compiler, "update_critic") as compiled, \
                fsdp_utils.phase_peak(self.plan.device_type, "update_critic") as peaks:
            metrics = self.critic.update_critic(data)
        metrics.update(peaks)
        metrics.update(_compiled_metric(compiled, "update_critic"))
        metrics.update(_mfu("critic", self.critic_module, self.plan, self._critic_model.compute_dtype, own,
                            int(self.config.get("ppo_epochs", 1)), time.perf_counter() - start, lm_head=False))
        metrics["critic/lr"] = self.critic_lr_scheduler.get_last_lr()[0]
        self.critic_lr_scheduler.step()
        return _output(self._meta(metrics))

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def save_checkpoint(self, local_path: str, hdfs_path: str | None = None, global_step: int = 0,
                        max_ckpt_to_keep: int | None = None) -> None:
        self.checkpoint_manager.save_checkpoint(local_path, hdfs_path, global_step, max_ckpt_to_keep)

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def load_checkpoint(self, local_path: str, hdfs_path: str | None = None, del_local_after_load: bool = False):
        self.checkpoint_manager.load_checkpoint(local_path, hdfs_path, del_local_after_load)


__all__ = ["ROLES", "ActorRolloutRefWorker", "CriticWorker"]
