"""RewardModelWorker: scores rollouts with a sequence-classification reward model, one process per device.

Set up entirely by the plan's `reward_model` role (verl/compat/planning/reward_model.py): weight and compute
dtypes, attention kernel, host offload between passes, rows per forward, and the float16 numerics
guard. Each rank holds a whole copy and scores its share of the batch; the score of a row is the
classifier's output at its last token, placed at the row's last response token as `rm_scores`.
"""
from __future__ import annotations

import contextlib
import logging
import math

import torch

from verl.compat import torch_dtype
from verl.compat.planning.reward_model import max_length, rm_setting, rm_setting_key
from verl.protocol import DataProto
from verl.single_controller.base.decorator import Dispatch, register
from verl.single_controller.base.worker import Worker
from verl.utils import fsdp_utils
from verl.workers.model_building.loading import load_tokenizer
from verl.utils.startup.clock import Laps
from verl.workers.reward_model.inputs import (
    classification_head_problem,
    left_padded,
    reward_model_token_ids,
    scores_at_last_token,
)

logger = logging.getLogger(__name__)

# A float16 score that differs from float32 by more than this (relative to 1 + |score|) fails the guard.
GUARD_TOLERANCE = 1e-2


class RewardModelWorker(Worker):
    """`config` is the run's whole config (the reward model's keys and the policy's tokenizer)."""

    def __init__(self, config, plan=None):
        super().__init__()
        self._laps = Laps(from_process_start=True)
        if plan is None or plan.reward_model is None:
            raise ValueError("RewardModelWorker needs a compat plan with a reward_model role "
                             "(verl.compat.build_plan(config) with reward_model.enable=True)")
        from verl.compat.apply.apply_plan import apply_in_process

        self.device = apply_in_process(plan, self.device_index)
        self.plan = plan
        self.role_plan = plan.reward_model
        fsdp_utils.init_distributed(plan.dist_backend)
        model_cfg = config.actor_rollout_ref.model
        self._input_tokenizer_source = (model_cfg.get("tokenizer_path") or model_cfg.path,
                                        bool(model_cfg.get("trust_remote_code", False)))
        self.path = rm_setting(config, "model_path")
        self.path_key = rm_setting_key(config, "model_path")
        self.trust_remote_code = bool(rm_setting(config, "trust_remote_code", False))
        self.max_length = max_length(config)
        self.compute_dtype = torch_dtype(self.role_plan.compute_dtype)
        self.guard_pending = self.role_plan.numerics_guard
        self._laps("constructor")

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self, total_training_steps: int | None = None) -> dict[str, float]:
        """Load the classifier in the plan's dtype and attention; returns the seconds each piece took.
        `total_training_steps` is accepted like the other roles' and unused (nothing is trained)."""
        from transformers import AutoModelForSequenceClassification

        laps = self._laps
        laps.restart()
        problem = classification_head_problem(self.path, self.path_key)
        if problem is not None:
            raise ValueError(problem)
        self.input_tokenizer = load_tokenizer(*self._input_tokenizer_source)
        self.tokenizer = load_tokenizer(self.path, self.trust_remote_code)
        model = AutoModelForSequenceClassification.from_pretrained(
            self.path, dtype=torch_dtype(self.role_plan.param_dtype),
            attn_implementation=self.role_plan.attn_implementation, trust_remote_code=self.trust_remote_code)
        model.eval().requires_grad_(False)
        self.home = torch.device("cpu") if self.role_plan.param_offload else self.device
        self.module = model.to(self.home)
        laps("reward_model_load")
        return laps.seconds

    @contextlib.contextmanager
    def _on_device(self):
        """The weights on the device for one pass; back to host memory afterwards where the plan offloads."""
        if self.home != self.device:
            self.module.to(self.device)
        try:
            yield
        finally:
            if self.home != self.device:
                self.module.to(self.home)

    def _forward(self, inputs: dict, dtype: torch.dtype) -> torch.Tensor:
        """Scores of one left-padded micro-batch: the classifier's output at the last column.

        The embeddings are passed instead of the ids, so transformers reads the last position rather
        than searching for padding by token id (a response may end in the token the tokenizer pads with).
        """
        inputs = {k: v.to(self.device) for k, v in inputs.items()}
        half = dtype != torch.float32
        autocast = torch.autocast(self.device.type, dtype=dtype) if half else torch.autocast(self.device.type,
                                                                                             enabled=False)
        with autocast:
            embeds = self.module.get_input_embeddings()(inputs["input_ids"])
            logits = self.module(inputs_embeds=embeds, attention_mask=inputs["attention_mask"],
                                 position_ids=inputs["position_ids"], use_cache=False).logits
        return logits[:, -1].float()

    def _check_numerics(self, inputs: dict) -> str | None:
        """The first micro-batch in float16 and float32; why float16 fails, or None."""
        self.guard_pending = False
        half, full = self._forward(inputs, self.compute_dtype), self._forward(inputs, torch.float32)
        if not torch.isfinite(half).all():
            return "float16 scores of the first batch are not finite"
        err = ((half - full).abs() / (1 + full.abs())).max().item()
        if err > GUARD_TOLERANCE:
            return f"float16 scores differ from float32 by {err:.3g} (relative; limit {GUARD_TOLERANCE})"
        return None

    @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
    def compute_rm_score(self, data: DataProto) -> DataProto:
        """`rm_scores` for each row of `data` (prompts, responses, attention_mask, and `raw_prompt`
        when the reward model re-templates the conversation)."""
        rows, cut = reward_model_token_ids(data, self.input_tokenizer, self.tokenizer, self.max_length)
        micro = max(int(self.role_plan.forward_micro_batch_size_per_gpu or len(rows)), 1)
        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        metrics = {}
        scores = []
        with fsdp_utils.phase_peak(self.plan.device_type, "reward_model") as peaks, torch.no_grad(), \
                self._on_device():
            for start in range(0, len(rows), micro):
                inputs = left_padded(rows[start:start + micro], pad)
                if self.guard_pending:
                    reason = self._check_numerics(inputs)
                    if reason is not None:
                        fallback = self.role_plan.guard_fallback_dtype or "float32"
                        logger.warning("reward model: %s; scoring in %s from now on", reason, fallback)
                        self.compute_dtype = torch_dtype(fallback)
                        metrics["reward_model/numerics_fallback"] = 1.0
                scores.append(self._forward(inputs, self.compute_dtype))
        metrics.update(peaks)
        metrics["reward_model/truncated_ratio"] = cut / max(len(rows), 1)
        score = torch.cat(scores) if scores else torch.zeros(0)
        if not torch.isfinite(score).all():
            bad = [i for i, ok in enumerate(torch.isfinite(score).tolist()) if not ok]
            raise FloatingPointError(f"the reward model at {self.path} gave non-finite scores for rows {bad[:8]}")
        metrics["reward_model/score_mean"] = score.mean().item() if len(score) else math.nan
        return DataProto.from_dict(tensors={"rm_scores": scores_at_last_token(score, data)},
                                   meta_info={"metrics": metrics})


__all__ = ["RewardModelWorker"]
