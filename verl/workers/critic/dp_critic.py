"""The PPO value function on one data-parallel rank: values per micro-batch and the clipped value update.

The critic is a one-label token classifier; its logit at position t is the value of the state that
produced token t+1, so the response's values are read one step to the left of the response tokens.
Values and losses are computed in float32 and normalised over the global mini-batch, as in the actor.
"""
from __future__ import annotations

import contextlib
import logging
from collections import defaultdict

import torch

from verl.protocol import DataProto
from verl.trainer.ppo.core_algos import compute_value_loss
from verl.utils import ulysses
from verl.utils.fsdp_utils import global_batch_info, optimizer_step
from verl.utils.packing import pack, padding_windows, unpack
from verl.utils.seqlen_balancing import group_to_agree, make_micro_batches, restore_dynamic_batch
from verl.utils.torch_functional import masked_mean, model_attention_mask
from verl.workers.actor.dp_actor import MODEL_INPUTS, Precision, _reduce_micro_metrics

logger = logging.getLogger(__name__)


class DataParallelPPOCritic:
    """Values and value-loss updates for one rank; `config` is the `critic` config, normalised per rank.

    `use_remove_padding` (the role plan's) runs each micro-batch as one packed row of real tokens.
    `sp_group`: the Ulysses group splitting each micro-batch's sequence (see DataParallelPPOActor).
    """

    def __init__(self, config, critic_module: torch.nn.Module, critic_optimizer=None, *, precision: Precision,
                 dp_group=None, use_remove_padding: bool = False, sp_group=None):
        self.config = config
        self.use_remove_padding = use_remove_padding
        self.sp_group = sp_group
        self.sp_size = ulysses.group_size(sp_group)
        self._last_shard = None   # the last split forward's layout, re-entered for its backward
        self.critic_module = critic_module
        self.critic_optimizer = critic_optimizer
        self.precision = precision
        self.dp_group = dp_group
        self._shuffle_generator = torch.Generator().manual_seed(int(config.get("data_loader_seed", 42) or 42))

    def _forward_micro_batch(self, micro_batch: dict, window: tuple[int, int] | None = None) -> torch.Tensor:
        """Values of the response positions, (batch, response_length) float32.

        `window` ([start, end) from `padding_windows`) drops columns that are padding in every row;
        response slots past it come back as 0.
        """
        response_length = micro_batch["responses"].shape[-1]
        if self.sp_group is not None:
            return self._forward_sequence_parallel(micro_batch, window)
        if self.use_remove_padding:
            packed = pack(micro_batch["input_ids"], micro_batch["attention_mask"], micro_batch["position_ids"],
                          response_length)
            with self.precision.autocast():
                output = self.critic_module(input_ids=packed.input_ids, attention_mask=None,
                                            position_ids=packed.position_ids, use_cache=False,
                                            **packed.attention_kwargs())
            return unpack(output.logits[0, packed.predictor_index, 0].float(), packed)
        seq_len = micro_batch["input_ids"].shape[1]
        start, end = window or (0, seq_len)
        kept = end - (seq_len - response_length)
        columns = slice(start, end)
        with self.precision.autocast():
            output = self.critic_module(
                input_ids=micro_batch["input_ids"][:, columns],
                attention_mask=model_attention_mask(self.critic_module, micro_batch["attention_mask"][:, columns]),
                position_ids=micro_batch["position_ids"][:, columns],
                use_cache=False,
            )
        values = output.logits.squeeze(-1).float()[:, -kept - 1 : -1]
        return torch.nn.functional.pad(values, (0, response_length - kept)) if kept < response_length else values

    def _forward_sequence_parallel(self, micro_batch: dict, window: tuple[int, int] | None) -> torch.Tensor:
        """As `_forward_micro_batch`, each rank of the Ulysses group running 1/sp of the sequence."""
        split = ulysses.split_micro_batch(micro_batch, window, self.use_remove_padding, self.sp_group)
        self._last_shard = split.shard
        with split.shard, self.precision.autocast():
            output = self.critic_module(**split.model_inputs())
        values = split.response_outputs(output.logits[..., 0].float())
        if split.packed is not None:
            return unpack(values, split.packed)
        return torch.nn.functional.pad(values, (0, micro_batch["responses"].shape[-1] - values.shape[1]))

    def _backward_layout(self):
        """The last split forward's layout for its backward (gradient checkpointing recomputes layers there)."""
        return self._last_shard if self._last_shard is not None else contextlib.nullcontext()

    def _windows(self, micro_batches: list[dict]) -> list:
        if self.use_remove_padding:
            return [None] * len(micro_batches)
        return padding_windows([mb["attention_mask"] for mb in micro_batches], micro_batches[0]["responses"].shape[-1])

    def _micro_batches(self, tensors: dict, micro_batch_size, max_token_len):
        if self.config.get("use_dynamic_bsz", False):
            max_token_len = int(max_token_len) * self.sp_size   # per device: an SP group holds sp times as many
            padded = None if self.use_remove_padding else tensors["responses"].shape[-1]
            return make_micro_batches(tensors, max_token_len=max_token_len, dp_group=group_to_agree(self.dp_group),
                                      padded_response_length=padded)
        return make_micro_batches(tensors, micro_batch_size=micro_batch_size)

    @staticmethod
    def _response_mask(data: DataProto) -> torch.Tensor:
        if "response_mask" in data.batch:
            return data.batch["response_mask"]
        return data.batch["attention_mask"][:, -data.batch["responses"].shape[-1] :]

    @torch.no_grad()
    def compute_values(self, data: DataProto) -> torch.Tensor:
        """Values of every response token (zero on padding), in input order."""
        self.critic_module.eval()
        tensors = {k: data.batch[k] for k in MODEL_INPUTS}
        micro_batches, partitions = self._micro_batches(
            tensors, data.meta_info.get("micro_batch_size"), data.meta_info.get("max_token_len")
        )
        values = torch.cat([self._forward_micro_batch(mb, w) for mb, w in zip(micro_batches, self._windows(micro_batches))])
        values = restore_dynamic_batch(values, partitions)
        return values * self._response_mask(data).to(values.dtype)

    def update_critic(self, data: DataProto) -> dict[str, list[float]]:
        """ppo_epochs passes, one optimizer step per mini-batch; upstream's critic/* metric names."""
        if self.critic_optimizer is None:
            raise RuntimeError("this critic has no optimizer")
        cfg = self.config
        self.critic_module.train()
        tensors = {k: data.batch[k] for k in list(MODEL_INPUTS) + ["values", "returns"]}
        tensors["response_mask"] = self._response_mask(data)
        metrics: dict[str, list[float]] = defaultdict(list)
        for _ in range(int(cfg.get("ppo_epochs", 1))):
            n = tensors["input_ids"].shape[0]
            order = torch.randperm(n, generator=self._shuffle_generator) if cfg.get("shuffle", False) else None
            shuffled = {k: v[order] for k, v in tensors.items()} if order is not None else tensors
            size = int(cfg.ppo_mini_batch_size)
            for start in range(0, n, size):
                mini_batch = {k: v[start : start + size] for k, v in shuffled.items()}
                batch_info = global_batch_info(mini_batch["response_mask"], self.dp_group, self.sp_size)
                micro_batches, _ = self._micro_batches(
                    mini_batch, cfg.get("ppo_micro_batch_size_per_gpu"), cfg.get("ppo_max_token_len_per_gpu")
                )
                micro_metrics = []
                for mb, window in zip(micro_batches, self._windows(micro_batches)):
                    mask = mb["response_mask"].float()
                    vpreds = self._forward_micro_batch(mb, window)
                    vf_loss, vf_clipfrac = compute_value_loss(
                        vpreds=vpreds,
                        returns=mb["returns"],
                        values=mb["values"],
                        response_mask=mask,
                        cliprange_value=float(cfg.cliprange_value),
                        loss_agg_mode=cfg.get("loss_agg_mode", "token-mean"),
                        loss_scale_factor=cfg.get("loss_scale_factor", None),
                        **batch_info,
                    )
                    scaled = self.precision.scaler.scale(vf_loss) if self.precision.scaler is not None else vf_loss
                    with self._backward_layout():
                        scaled.backward()
                    # Kept on the device: read once per mini-batch, not once per micro-batch.
                    micro_metrics.append({"critic/vf_loss": vf_loss.detach(), "critic/vf_clipfrac": vf_clipfrac,
                                          "critic/vpred_mean": masked_mean(vpreds.detach(), mask)})
                grad_norm, stepped = optimizer_step(
                    self.critic_optimizer, self.critic_module.parameters(), cfg.get("grad_clip"), self.precision.scaler
                )
                if not stepped:
                    logger.warning("critic: non-finite grad norm (%s); optimizer step skipped", grad_norm)
                for name, value in _reduce_micro_metrics(micro_metrics, ("critic/vf_loss",)).items():
                    metrics[name].append(value)
                metrics["critic/grad_norm"].append(grad_norm)
        return dict(metrics)
