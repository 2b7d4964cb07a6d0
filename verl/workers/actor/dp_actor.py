"""The PPO policy on one data-parallel rank: log-probs per micro-batch, and the clipped-objective update.

The model is already sharded (FSDP) by the worker; this module only does the math. Logits are turned
into log-probs and entropies in float32, whatever dtype the model computes in, and every micro-batch
loss is normalised by the *global* mini-batch's token/sequence counts, so the accumulated gradient is
the same for any micro-batch size, token budget or data-parallel size.
"""
from __future__ import annotations

import contextlib
import inspect
import logging
from collections import defaultdict

import torch
from omegaconf import OmegaConf

from verl.protocol import DataProto
from verl.trainer.ppo.core_algos import agg_loss, get_policy_loss_fn, kl_penalty
from verl.utils import ulysses
from verl.utils.fsdp_utils import global_batch_info, optimizer_step
from verl.utils.packing import pack, padding_windows, unpack
from verl.utils.seqlen_balancing import group_to_agree, make_micro_batches, restore_dynamic_batch
from verl.utils.torch_functional import (compiled_log_prob_kernels, logprobs_and_entropy, logprobs_from_logits,
                                         model_attention_mask)

logger = logging.getLogger(__name__)

MODEL_INPUTS = ("input_ids", "attention_mask", "position_ids", "responses")
ROW = "row_index"  # each row's place in the batch: micro-batches find their rows' pixel inputs by it


def model_inputs(data: DataProto, keys) -> tuple[dict, object]:
    """The batch tensors under `keys`, and the rows' `multi_modal_inputs` (None for text-only data).

    With images, a `row_index` column rides along through shuffling and micro-batching, so each
    micro-batch can gather its own rows' pixel tensors (see `image_kwargs`)."""
    tensors = {k: data.batch[k] for k in keys}
    images = data.non_tensor_batch.get("multi_modal_inputs")
    if images is None and data.batch["position_ids"].dim() == 3:
        raise KeyError("the batch has (batch, 4, seq) multimodal position ids but no multi_modal_inputs (the "
                       "pixel inputs RLHFDataset puts in every image row); a custom data.custom_cls must add them")
    if images is not None:
        tensors[ROW] = torch.arange(len(data), device=data.batch["input_ids"].device)
    return tensors, images


def image_kwargs(micro_batch: dict, images, device) -> dict:
    """pixel_values / image_grid_thw of a micro-batch's rows, in row order (empty without images)."""
    if images is None:
        return {}
    from verl.utils.dataset.vision_utils import concat_multi_modal_inputs

    joined = concat_multi_modal_inputs([images[i] for i in micro_batch[ROW].tolist()])
    return {k: v.to(device) for k, v in joined.items()}


def model_positions(position_ids: torch.Tensor) -> torch.Tensor:
    """Position ids as the model takes them: (batch, seq), or a VL model's (4, batch, seq) from the
    batch's (batch, 4, seq)."""
    return position_ids.transpose(0, 1) if position_ids.dim() == 3 else position_ids


class Precision:
    """How a model computes: autocast dtype (None = as stored) and an optional fp16 grad scaler."""

    def __init__(self, device_type: str, autocast_dtype: torch.dtype | None = None, scaler=None):
        self.device_type = device_type
        self.autocast_dtype = autocast_dtype
        self.scaler = scaler

    def autocast(self):
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.autocast_dtype)


def _accepts_logits_to_keep(module: torch.nn.Module) -> bool:
    try:
        return "logits_to_keep" in inspect.signature(type(module).forward).parameters
    except (TypeError, ValueError):
        return False


_SUMMED = ("actor/pg_loss", "actor/kl_loss", "actor/entropy")


def _reduce_micro_metrics(micro_metrics: list[dict], summed: tuple[str, ...]) -> dict[str, float]:
    """One mini-batch's metrics from its micro-batches' values (floats or device tensors), read from
    the device in one transfer: names in `summed` add up, the others are averaged."""
    names = list(dict.fromkeys(name for m in micro_metrics for name in m))
    flat = [(name, m[name]) for m in micro_metrics for name in names if name in m]
    tensors = [v.detach().float().reshape(()) for _, v in flat if isinstance(v, torch.Tensor)]
    host = iter(torch.stack(tensors).tolist() if tensors else [])
    values: dict[str, list[float]] = defaultdict(list)
    for name, v in flat:
        values[name].append(next(host) if isinstance(v, torch.Tensor) else float(v))
    return {name: sum(v) if name in summed else sum(v) / len(v) for name, v in values.items()}


def _response_slots(micro_batch: dict, log_probs: torch.Tensor, entropy, end: int):
    """(batch, response_length) values of a padded micro-batch run up to column `end` (log_probs/entropy
    hold its first `kept` response slots): padding slots read 0, as in the packed path."""
    seq_len, response_length = micro_batch["input_ids"].shape[1], micro_batch["responses"].shape[-1]
    real = micro_batch["attention_mask"][:, seq_len - response_length : end].bool()
    pad = (0, response_length - real.shape[1])
    log_probs = torch.nn.functional.pad(log_probs.masked_fill(~real, 0.0), pad)
    entropy = torch.nn.functional.pad(entropy.masked_fill(~real, 0.0), pad) if entropy is not None else None
    return log_probs, entropy


class DataParallelPPOActor:
    """Policy log-probs and PPO updates for one rank.

    `config` is the `actor_rollout_ref.actor` (or `.ref`) config with per-rank batch sizes already
    normalised by the worker. `actor_optimizer` is None for the reference policy.
    `use_remove_padding` (the role plan's) runs each micro-batch as one packed row of real tokens.
    `sp_group` (Ulysses, `verl.utils.ulysses`): the ranks that split each micro-batch's sequence; they
    are handed the same rows.
    """

    def __init__(self, config, actor_module: torch.nn.Module, actor_optimizer=None, *, precision: Precision,
                 dp_group=None, use_remove_padding: bool = False, use_torch_compile: bool = False,
                 compile_backend: str = "inductor", sp_group=None, compiler=None):
        self.config = config
        self.use_remove_padding = use_remove_padding
        self.sp_group = sp_group
        self.sp_size = ulysses.group_size(sp_group)
        self._last_shard = None   # the last split forward's layout, re-entered for its backward
        # The plan's torch_compile: the per-chunk math over the vocabulary (log-sum-exp, the log-prob's
        # gradient, the entropy's statistics) is the elementwise-heavy part here and fuses well: one
        # kernel per chunk and direction, reading the logits in their own dtype.
        # `compiler` (verl/utils/compile_beside.py): eager kernels until the compiled ones, built beside, take over.
        self._kernels = compiled_log_prob_kernels(compile_backend, compiler) if use_torch_compile else None
        self.actor_module = actor_module
        self.actor_optimizer = actor_optimizer
        self.precision = precision
        self.dp_group = dp_group
        self._logits_to_keep = _accepts_logits_to_keep(actor_module)
        self._shuffle_generator = torch.Generator().manual_seed(int(config.get("data_loader_seed", 42) or 42))
        if actor_optimizer is not None:
            # A plain DictConfig copy the registered policy losses can read, plus the per-mini-batch
            # `global_batch_info` they aggregate with.
            self._loss_config = OmegaConf.create(OmegaConf.to_container(config, resolve=True))
            self._loss_config.global_batch_info = {}

    # ------------------------------------------------------------------ forward

    def _forward_micro_batch(self, micro_batch: dict, temperature: float, calculate_entropy: bool,
                             window: tuple[int, int] | None = None, images=None):
        """(log_probs, entropy or None) of the response tokens, both (batch, response_length) float32.

        `window` ([start, end) columns from `padding_windows`) drops columns that are padding in every
        row. Response padding slots come back as 0. `images` are the batch's multi_modal_inputs rows.
        """
        if self.sp_group is not None:
            return self._forward_sequence_parallel(micro_batch, temperature, calculate_entropy, window)
        if self.use_remove_padding and images is None:
            return self._forward_packed(micro_batch, temperature, calculate_entropy)
        responses = micro_batch["responses"]
        response_length = responses.shape[-1]
        seq_len = micro_batch["input_ids"].shape[1]
        start, end = window or (0, seq_len)
        kept = end - (seq_len - response_length)   # response columns inside the window
        columns = slice(start, end)
        # The last kept prompt column predicts the first response token: keep kept + 1 outputs.
        kwargs = {"logits_to_keep": kept + 1} if self._logits_to_keep else {}
        kwargs.update(image_kwargs(micro_batch, images, micro_batch["input_ids"].device))
        with self.precision.autocast():
            output = self.actor_module(
                input_ids=micro_batch["input_ids"][:, columns],
                attention_mask=model_attention_mask(self.actor_module, micro_batch["attention_mask"][:, columns]),
                position_ids=model_positions(micro_batch["position_ids"][..., columns]),
                use_cache=False,
                **kwargs,
            )
        # Position t predicts token t+1. All kept + 1 rows of logits go in (a contiguous view, no copy of
        # the (tokens, vocab) tensor); the extra last row gets a dummy label and is dropped after. Where the
        # model kept only those rows, no slice: a slice's backward copies the gradient into a zeroed full tensor.
        logits = output.logits if self._logits_to_keep else output.logits[:, -kept - 1 :, :]
        if temperature != 1.0:
            logits = logits / temperature
        labels = torch.nn.functional.pad(responses[:, :kept], (0, 1))
        log_probs, entropy = self._log_probs(logits, labels, calculate_entropy)
        log_probs, entropy = log_probs[:, :kept], entropy[:, :kept] if entropy is not None else None
        return _response_slots(micro_batch, log_probs, entropy, end)

    def _forward_sequence_parallel(self, micro_batch: dict, temperature: float, calculate_entropy: bool,
                                   window: tuple[int, int] | None):
        """As `_forward_micro_batch`, with this rank running 1/sp of the sequence (`verl.utils.ulysses`).
        Every local position gets its log-prob against the next token of the whole sequence; the group's
        slices are gathered and the response's predicting positions read out."""
        split = ulysses.split_micro_batch(micro_batch, window, self.use_remove_padding, self.sp_group)
        self._last_shard = split.shard
        with split.shard, self.precision.autocast():
            output = self.actor_module(**split.model_inputs())
        logits = output.logits
        if temperature != 1.0:
            logits = logits / temperature
        log_probs, entropy = self._log_probs(logits, split.next_tokens(), calculate_entropy)
        log_probs = split.response_outputs(log_probs)
        entropy = split.response_outputs(entropy) if entropy is not None else None
        if split.packed is not None:
            return unpack(log_probs, split.packed), unpack(entropy, split.packed) if entropy is not None else None
        return _response_slots(micro_batch, log_probs, entropy, split.end)

    def _forward_packed(self, micro_batch: dict, temperature: float, calculate_entropy: bool):
        """As `_forward_micro_batch`, on one packed row; slots without a real response token are 0."""
        responses = micro_batch["responses"]
        packed = pack(micro_batch["input_ids"], micro_batch["attention_mask"], micro_batch["position_ids"],
                      responses.shape[-1])
        # Only the predicting positions go through the LM head (transformers takes an index tensor here).
        kwargs = {"logits_to_keep": packed.predictor_index} if self._logits_to_keep else {}
        kwargs.update(packed.attention_kwargs())
        with self.precision.autocast():
            output = self.actor_module(input_ids=packed.input_ids, attention_mask=None,
                                       position_ids=packed.position_ids, use_cache=False, **kwargs)
        # squeeze, not [0]: a select's backward copies the gradient into a zeroed (1, tokens, vocab) tensor
        logits = output.logits.squeeze(0) if self._logits_to_keep else output.logits[0, packed.predictor_index]
        if temperature != 1.0:
            logits = logits / temperature
        log_probs, entropy = self._log_probs(logits, responses[packed.target], calculate_entropy)
        return unpack(log_probs, packed), unpack(entropy, packed) if entropy is not None else None

    def _log_probs(self, logits: torch.Tensor, labels: torch.Tensor, calculate_entropy: bool):
        """float32 (log-probs, entropies or None); both from one chunked pass over the vocabulary."""
        if calculate_entropy:
            return logprobs_and_entropy(logits, labels, self._kernels.entropy if self._kernels else None)
        return logprobs_from_logits(logits, labels, kernels=self._kernels), None

    def _micro_batches(self, tensors: dict, micro_batch_size, use_dynamic_bsz: bool, max_token_len):
        if use_dynamic_bsz:
            # the token budget is per device: a sequence-parallel group holds sp times as many tokens
            max_token_len = int(max_token_len) * self.sp_size
            padded = None if self.use_remove_padding else tensors["responses"].shape[-1]
            return make_micro_batches(tensors, max_token_len=max_token_len, dp_group=group_to_agree(self.dp_group),
                                      padded_response_length=padded)
        return make_micro_batches(tensors, micro_batch_size=micro_batch_size)

    def _backward_layout(self):
        """The last split forward's layout for its backward (gradient checkpointing recomputes layers there)."""
        return self._last_shard if self._last_shard is not None else contextlib.nullcontext()

    def _windows(self, micro_batches: list[dict], images=None) -> list:
        """Padding-free column windows of the micro-batches (packed rows have no padding to drop)."""
        if self.use_remove_padding and images is None:
            return [None] * len(micro_batches)
        return padding_windows([mb["attention_mask"] for mb in micro_batches], micro_batches[0]["responses"].shape[-1])

    @torch.no_grad()
    def compute_log_prob(self, data: DataProto, calculate_entropy: bool = False):
        """Log-probs (and entropies) of `data`'s responses under the current weights, in input order.

        Reads meta_info `micro_batch_size`, `temperature`, `use_dynamic_bsz` and `max_token_len`.
        """
        self.actor_module.eval()
        meta = data.meta_info
        tensors, images = model_inputs(data, MODEL_INPUTS)
        micro_batches, partitions = self._micro_batches(
            tensors, meta.get("micro_batch_size"), bool(meta.get("use_dynamic_bsz", False)), meta.get("max_token_len")
        )
        log_probs, entropies = [], []
        for micro_batch, window in zip(micro_batches, self._windows(micro_batches, images)):
            lp, ent = self._forward_micro_batch(micro_batch, float(meta.get("temperature", 1.0)), calculate_entropy,
                                                window, images)
            log_probs.append(lp)
            entropies.append(ent)
        log_probs = restore_dynamic_batch(torch.cat(log_probs), partitions)
        entropy = restore_dynamic_batch(torch.cat(entropies), partitions) if calculate_entropy else None
        return log_probs, entropy

    # ------------------------------------------------------------------ update

    def _mini_batches(self, tensors: dict) -> list[dict]:
        """Split the rank's batch into `ppo_mini_batch_size` rows each, shuffled if configured."""
        n = tensors["input_ids"].shape[0]
        if self.config.get("shuffle", False):
            order = torch.randperm(n, generator=self._shuffle_generator)
            tensors = {k: v[order] for k, v in tensors.items()}
        size = int(self.config.ppo_mini_batch_size)
        return [{k: v[s : s + size] for k, v in tensors.items()} for s in range(0, n, size)]

    def _micro_loss(self, micro_batch: dict, temperature: float, batch_info: dict, window=None, images=None):
        """Total loss of one micro-batch (already globally normalised) and its metrics.

        Metric values stay on the device (detached tensors) so the micro-batch loop never waits for
        the device; `update_policy` reads them once per mini-batch.
        """
        cfg = self.config
        entropy_coeff = float(cfg.get("entropy_coeff", 0.0) or 0.0)
        calculate_entropy = entropy_coeff != 0 or bool(cfg.get("calculate_entropy", False))
        log_prob, entropy = self._forward_micro_batch(micro_batch, temperature, calculate_entropy, window, images)
        response_mask = micro_batch["response_mask"].to(log_prob.dtype)
        loss_agg_mode = cfg.get("loss_agg_mode", "token-mean")
        agg_kwargs = dict(batch_info, loss_scale_factor=cfg.get("loss_scale_factor", None))

        self._loss_config.global_batch_info = agg_kwargs
        loss_mode = cfg.get("policy_loss", {}).get("loss_mode", "vanilla") if cfg.get("policy_loss") else "vanilla"
        pg_loss, metrics = get_policy_loss_fn(loss_mode)(
            old_log_prob=micro_batch["old_log_probs"],
            log_prob=log_prob,
            advantages=micro_batch["advantages"],
            response_mask=response_mask,
            loss_agg_mode=loss_agg_mode,
            config=self._loss_config,
        )
        metrics = dict(metrics)
        metrics["actor/pg_loss"] = pg_loss.detach()
        loss = pg_loss
        if entropy is not None:
            entropy_loss = agg_loss(entropy, response_mask, loss_agg_mode, **agg_kwargs)
            metrics["actor/entropy"] = entropy_loss.detach()
            loss = loss - entropy_coeff * entropy_loss
        if cfg.get("use_kl_loss", False):
            kld = kl_penalty(log_prob, micro_batch["ref_log_prob"], cfg.get("kl_loss_type", "low_var_kl"))
            kl_loss = agg_loss(kld, response_mask, loss_agg_mode, **agg_kwargs)
            metrics["actor/kl_loss"] = kl_loss.detach()
            loss = loss + float(cfg.kl_loss_coef) * kl_loss
        return loss, metrics

    def update_policy(self, data: DataProto) -> dict[str, list[float]]:
        """ppo_epochs passes over the batch, one optimizer step per mini-batch.

        Returns upstream's metric names, each a list with one value per mini-batch (losses: the
        mini-batch loss of this rank's share, so the mean over ranks is the global loss).
        """
        if self.actor_optimizer is None:
            raise RuntimeError("this actor has no optimizer (reference policy); update_policy is for the actor role")
        cfg = self.config
        self.actor_module.train()
        temperature = float(data.meta_info.get("temperature", 1.0))
        keys = list(MODEL_INPUTS) + ["old_log_probs", "advantages"]
        if cfg.get("use_kl_loss", False):
            if "ref_log_prob" not in data.batch.keys():
                raise KeyError("actor.use_kl_loss=True needs 'ref_log_prob' in the batch (run compute_ref_log_prob)")
            keys.append("ref_log_prob")
        tensors, images = model_inputs(data, keys)
        response_length = tensors["responses"].shape[-1]
        tensors["response_mask"] = (
            data.batch["response_mask"] if "response_mask" in data.batch.keys()
            else data.batch["attention_mask"][:, -response_length:]
        )

        metrics: dict[str, list[float]] = defaultdict(list)
        for _ in range(int(cfg.get("ppo_epochs", 1))):
            for mini_batch in self._mini_batches(tensors):
                batch_info = global_batch_info(mini_batch["response_mask"], self.dp_group, self.sp_size)
                micro_batches, _ = self._micro_batches(
                    mini_batch, cfg.get("ppo_micro_batch_size_per_gpu"), bool(cfg.get("use_dynamic_bsz", False)),
                    cfg.get("ppo_max_token_len_per_gpu"),
                )
                micro_metrics: list[dict] = []
                for micro_batch, window in zip(micro_batches, self._windows(micro_batches, images)):
                    loss, values = self._micro_loss(micro_batch, temperature, batch_info, window, images)
                    scaled = self.precision.scaler.scale(loss) if self.precision.scaler is not None else loss
                    with self._backward_layout():
                        scaled.backward()
                    micro_metrics.append(values)
                grad_norm, stepped = optimizer_step(
                    self.actor_optimizer, self.actor_module.parameters(), cfg.get("grad_clip"), self.precision.scaler
                )
                if not stepped:
                    logger.warning("actor: non-finite grad norm (%s); optimizer step skipped", grad_norm)
                # Globally normalised losses add up over micro-batches; ratios are averaged.
                for name, value in _reduce_micro_metrics(micro_metrics, _SUMMED).items():
                    metrics[name].append(value)
                metrics["actor/grad_norm"].append(grad_norm)
        if cfg.get("use_kl_loss", False):
            metrics["actor/kl_coef"] = [float(cfg.kl_loss_coef)]
        return dict(metrics)
