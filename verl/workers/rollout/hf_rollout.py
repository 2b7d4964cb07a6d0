"""The built-in rollout engine: batched sampling from the actor's own HF causal LM with a KV cache.

It needs nothing beyond torch and transformers, so it runs wherever training runs (CPU included),
and it reads the actor's weights in place: there is no second copy of the model. The decode loop is
ours rather than `model.generate`, so sampling is done in float32 by code we test, and the loop
can stay in lock-step across FSDP ranks.

Two ways to run the model: Llama-family models with unsharded weights (the actor worker unshards
before generating) go through `StaticDecoder` (a preallocated KV cache, one prefill pass, then a
fixed-shape step per token, replayed as a CUDA graph when the plan says `rollout.cuda_graphs`);
anything else (other architectures, weights still sharded) calls the HF forward with its own cache.
A vision-language model with a Qwen2 text model (Qwen2-VL, Qwen2.5-VL) takes the static path too, its
prefill (pixels, multimodal positions) through the model's own forward, whose cache then seeds the
decoder's (`StaticDecoder.load_prefix`); its generated tokens are text and decode like a text model's.

Three things keep the static path's work to what the rows hold: a chunk's prompts lose the left-padding
columns every row shares before prefill (see `trim_common_padding`), the decoder attends over the
filled part of its cache only, and rows that have emitted EOS leave the decoder once they are half of
it (`HFRollout._leave`). The EOS stop is asked every few steps, not every token (`eos_check_due`).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from verl.protocol import DataProto
from verl.workers.model_building.frozen_weights import compute_dtype_of

from .base import BaseRollout, inner_module, output_tensors, special_tokens
from .static_decoder import StaticDecoder, compiled_decode_step, static_decoding_unsupported

__all__ = ["HFRollout", "SamplingParams", "candidate_logits", "eos_check_due", "filter_logits", "leave_due",
           "compiled_race", "race_winner", "rollout_autocast_dtype", "sample_next_token",
           "trim_common_padding"]

# A trimmed prompt keeps a multiple of this many columns (some padding stays): chunks then mostly share
# a width, so the static decoder, its recorded graphs and the compiled step's shapes are reused
# across chunks instead of rebuilt for every exact width.
TRIM_MULTIPLE = 64
# Beyond the first 16 steps, whether every row has finished is asked once per this many steps.
EOS_CHECK_EVERY = 16
# Finished rows leave the static decoder once at most half its rows run on (`HFRollout._leave`), asked on a
# schedule of its own (`leave_due`), so that how often the EOS stop is asked changes no sampled token.
LEAVE_WHEN_HALF_FINISHED = True
LEAVE_CHECK_EVERY = 16


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each next token. Greedy when `do_sample` is false or temperature is 0."""

    do_sample: bool = True
    temperature: float = 1.0
    top_k: int = 0  # <= 0: off (vLLM writes -1, HF writes 0)
    top_p: float = 1.0  # >= 1: off

    @property
    def greedy(self) -> bool:
        return not self.do_sample or self.temperature <= 0


def filter_logits(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """Mask (to -inf) every token outside the top-k and outside the top-p nucleus, row by row.

    The nucleus is the smallest set of most likely tokens whose probability mass reaches `top_p`:
    a token is kept when the mass of the tokens ranked above it is still below `top_p`, so the most
    likely token always survives. With both filters, top-k is applied first and the nucleus is taken
    within the renormalised top-k distribution (the order HF and vLLM use).
    """
    logits = logits.float()
    if top_k is not None and 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p is not None and top_p < 1.0:
        if top_p <= 0:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        mass_above = torch.cumsum(probs, dim=-1) - probs
        drop_sorted = mass_above >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits


# A top-p-only nucleus is first looked for among this many most likely tokens (one partial top-k
# instead of a sort of the whole vocabulary); rows whose nucleus is wider fall back to the full sort.
TOP_P_CANDIDATES = 1024


def _outside_nucleus(sorted_probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """For probabilities sorted high to low: True where the mass ranked above already reaches top_p."""
    return torch.cumsum(sorted_probs, dim=-1) - sorted_probs >= top_p


def candidate_logits(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0):
    """The tokens still in play after top-k and top-p, as `(logits, ids)`.

    `logits` keeps only candidates (-inf for dropped ones), `ids` maps each column to its vocabulary id,
    or is None when the columns are the whole vocabulary. The kept set is the one `filter_logits`
    keeps; only the work differs: with top-k, one partial top-k and a sort of k values; with top-p
    alone, the top TOP_P_CANDIDATES tokens when they hold every row's nucleus (the common case).
    """
    logits = logits.float()
    vocab = logits.shape[-1]
    if top_p is not None and top_p <= 0:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    use_p = top_p is not None and top_p < 1.0
    if top_k is not None and 0 < top_k < vocab:
        values, ids = torch.topk(logits, top_k, dim=-1)  # sorted high to low
        if use_p:
            values = values.masked_fill(_outside_nucleus(torch.softmax(values, dim=-1), top_p), float("-inf"))
        return values, ids
    if not use_p:
        return logits, None
    if vocab > TOP_P_CANDIDATES:
        values, ids = torch.topk(logits, TOP_P_CANDIDATES, dim=-1)
        probs = torch.exp(values - torch.logsumexp(logits, dim=-1, keepdim=True))  # shares of the whole vocabulary
        if bool((probs.sum(dim=-1) >= top_p).all()):
            return values.masked_fill(_outside_nucleus(probs, top_p), float("-inf")), ids
    return filter_logits(logits, 0, top_p), None


def sample_next_token(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None = None,
                      race_kernel=None):
    """One token id per row of (batch, vocab) logits in any float dtype, computed in float32 on their device.

    Sampled as a race: each candidate j draws E_j ~ Exp(1) and the smallest E_j / p_j wins, which it
    does with probability p_j exactly. In logits that is argmax(x_j - log E_j) (the Gumbel-max trick):
    no softmax and no cumulative sums, fewer passes over the (batch, vocab) scores than softmax and
    `torch.multinomial` take (docs/performance.md, "Why the code does it this way"). E is kept above
    zero, so a dropped candidate (x = -inf) can never win. `race_kernel` (`compiled_race`), where given,
    picks the winner over the whole vocabulary in one fused pass that reads the logits in their own dtype;
    it draws the same E from `generator`, so the stream of draws is the same either way.
    """
    if params.greedy:
        return logits.argmax(dim=-1)   # float32 is exact for every half value: the same argmax
    unfiltered = not (0 < params.top_k < logits.shape[-1]) and not params.top_p < 1.0
    if race_kernel is not None and unfiltered:
        race = torch.empty(logits.shape, dtype=torch.float32, device=logits.device).exponential_(generator=generator)
        return race_kernel(logits, race, params.temperature)
    logits = logits.float()
    scaled = logits if params.temperature == 1.0 else logits / params.temperature
    values, ids = candidate_logits(scaled, params.top_k, params.top_p)
    race = torch.empty_like(values).exponential_(generator=generator)
    race.clamp_(min=torch.finfo(race.dtype).tiny).log_()
    choice = torch.sub(values, race, out=race).argmax(dim=-1, keepdim=True)
    return (choice if ids is None else ids.gather(-1, choice)).squeeze(-1)


def race_winner(logits: torch.Tensor, race: torch.Tensor, temperature: float) -> torch.Tensor:
    """argmax_j(x_j / temperature - log E_j) per row, in float32, for logits in any float dtype and the
    race's draws E (float32): the sampler's pass over the vocabulary as one function to compile."""
    x = logits.float()
    if temperature != 1.0:
        x = x / temperature
    return (x - race.clamp(min=torch.finfo(torch.float32).tiny).log()).argmax(dim=-1)


@functools.lru_cache(maxsize=None)
def compiled_race(backend):
    """`race_winner` under torch.compile with `backend`: one kernel reading the half logits and the draws,
    instead of a float32 copy of the logits and four passes over it. Rows symbolic (chunks and validation
    share it); one wrapper per backend for the process."""
    return torch.compile(race_winner, backend=backend, fullgraph=True, dynamic=True)


def rollout_autocast_dtype(rollout_dtype: torch.dtype | None, weight_dtype: torch.dtype) -> torch.dtype | None:
    """The dtype to autocast generation to, or None to run in the weights' own dtype.

    Autocast can only lower precision: float32 generation over half-precision weights is beyond it,
    so that case fails with what to change instead of silently sampling in half precision.
    """
    if rollout_dtype is None or rollout_dtype == weight_dtype:
        return None
    if rollout_dtype == torch.float32:
        raise ValueError(
            f"the plan asks for a float32 rollout but the weights the engine sees are {weight_dtype}; autocast "
            "cannot raise precision. Keep the weights float32 while generating, or set "
            "actor_rollout_ref.rollout.dtype to the actor's compute dtype."
        )
    return rollout_dtype


def trim_common_padding(ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor):
    """The prompts without the leading columns that are padding in every row (mask zero throughout).
    `pos` is (batch, seq), or a VL model's (batch, 4, seq); its last dimension is cut like the others.

    Such columns are masked keys for every query and no row's query reads them, so dropping them
    changes no token: it only shrinks the prefill and the KV cache every decode step reads. The kept
    width is rounded up to a multiple of TRIM_MULTIPLE (capped at the full width) so that chunks of
    similar prompts get one width and share one decoder and its CUDA graphs; 64 columns of padding at
    most stay, against e.g. ~300 cut from a GSM8K chunk padded to 512. One host sync per chunk.
    """
    width = ids.shape[1]
    filled = mask.bool().any(dim=0)
    first = int(filled.to(torch.int8).argmax())  # the first filled column; 0 (keep all) when none is
    keep = min(width, -(-(width - first) // TRIM_MULTIPLE) * TRIM_MULTIPLE)
    return ids[:, width - keep:], mask[:, width - keep:], pos[..., width - keep:]  # pos: (batch, [4,] seq)


def _due(step: int, every: int) -> bool:
    n = step + 1
    return n % every == 0 or n & (n - 1) == 0


def leave_due(step: int) -> bool:
    """Whether finished rows may leave the static decoder after decode step `step`: after steps 1, 2, 4, 8,
    16 and every LEAVE_CHECK_EVERY-th (the EOS stop's default schedule, so no read from the device is added).
    Rows that leave change which draws of the sampling stream the others take, so this schedule depends on
    the step alone: the same seed gives the same tokens, however often the EOS stop is asked."""
    return _due(step, LEAVE_CHECK_EVERY)


def eos_check_due(step: int) -> bool:
    """Whether to ask, after decode step `step` (0-based), if every row has emitted EOS.

    Asking reads a device flag on the host (under sharded weights, after an all_reduce), so the host
    cannot queue the next step before the current one ends. It is asked after steps 1, 2, 4, 8 and 16,
    so short generations stop within twice their length, then after every EOS_CHECK_EVERY-th step;
    the steps run past the last EOS only write padding, so the output does not change. The schedule
    depends on the step alone: every rank asks at the same steps, as lock-step decoding needs.
    """
    return _due(step, EOS_CHECK_EVERY)


def _cfg(config, key, default=None):
    value = config.get(key, default) if hasattr(config, "get") else getattr(config, key, default)
    return default if value is None else value



def _is_sharded(module: nn.Module) -> bool:
    """True when each forward all-gathers weights, so every rank must run the same number of them.

    That is FSDP1, or FSDP2 with its parameters still sharded (DTensors). A caller that unshards
    FSDP2 once before generating (the actor worker does) gets plain tensors and free-running ranks.
    """
    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return False
    if hasattr(module, "_fsdp_wrapped_module"):
        return True
    from torch.distributed.tensor import DTensor

    return any(isinstance(p, DTensor) for p in module.parameters())


def _image_inputs(prompts: DataProto, device) -> dict:
    """A chunk's pixel inputs for the model's forward (empty for text-only prompts)."""
    from verl.utils.dataset.vision_utils import concat_multi_modal_inputs

    rows = prompts.non_tensor_batch.get("multi_modal_inputs")
    if rows is None:
        return {}
    return {k: v.to(device) for k, v in concat_multi_modal_inputs(rows).items()}


class HFRollout(BaseRollout):
    """Generate with `module`, the actor's causal LM (plain, FSDP1-wrapped or FSDP2-sharded).

    The module is called directly at every decode step, so no extra copy of the weights is kept.
    If the weights are still sharded (FSDP1, or FSDP2 not unsharded by the caller), each step
    gathers them and the ranks decode in lock-step, stopping only when all ranks are done; a caller
    that unshards FSDP2 once beforehand (cheaper) lets each rank stop on its own.
    `config` is the `actor_rollout_ref.rollout` section (temperature, top_k, top_p, do_sample,
    response_length, seed, ignore_eos, val_kwargs, and the optional micro_batch_size).
    `plan` is the compat plan: `rollout.cuda_graphs` records the static decode step as a CUDA graph,
    `rollout.fused_projections` decodes with q/k/v and gate/up each as one matmul (`fuse_projections`),
    `rollout.compile_backend` compiles its per-layer step first (None: eager), or, with `compiler` (a
    `verl.utils.compile_beside.BesideCompiler`), beside the first eager rollouts;
    generation runs in its `rollout.dtype`, by autocast when the weights
    are in another dtype, on every device. The engine alone decides this (callers add no autocast of
    their own); `dtype` holds the decision, which the actor worker resets from the re-issued plan when
    the fp16 numerics guard rejects the model (verl.compat.apply.precision).
    Every call is generated `micro_batch_size` rows at a time (the plan's `rollout.micro_batch_size`,
    sized by the memory model; else the config's; else the whole batch), so a batch of any size, a
    whole validation set included, peaks at one chunk's memory.
    """

    def __init__(self, module: nn.Module, config, plan=None, compiler=None):
        self.module = module
        self.config = config
        self._generator: torch.Generator | None = None
        self.dtype = None
        self.cuda_graphs = False
        self.compile_backend = None
        self.fused_projections = False
        # An unresolved `auto` (no plan ran over this config) means the whole batch at once.
        configured = _cfg(config, "micro_batch_size")
        self.micro_batch_size = None if configured == "auto" else configured
        if plan is not None:
            from verl.compat import torch_dtype

            self.dtype = torch_dtype(plan.rollout.dtype)
            self.micro_batch_size = plan.rollout.micro_batch_size or self.micro_batch_size
            self.cuda_graphs = bool(getattr(plan.rollout, "cuda_graphs", False))
            self.compile_backend = getattr(plan.rollout, "compile_backend", None)
            self.fused_projections = bool(getattr(plan.rollout, "fused_projections", False))
        # with a BesideCompiler (the worker's, under compile_warmup=background) the decode step runs eagerly
        # until its compiled form, built beside the first rollouts, takes over
        self._step = (compiled_decode_step(self.compile_backend, compiler)
                      if compiler is not None and self.compile_backend else None)
        # the sampler's pass over the vocabulary compiled with the decode step, behind the same switch
        self._race = None
        if self.compile_backend:
            race = compiled_race(self.compile_backend)
            self._race = race if compiler is None else compiler.function("sampler", race_winner, race)
        forward_params = inspect.signature(inner_module(module).forward).parameters
        # transformers 5 renamed `past_key_values` to `cache`; follow whichever this model takes.
        self._cache_kw = "cache" if "cache" in forward_params else "past_key_values"
        self._keep_kw = next((k for k in ("logits_to_keep", "num_logits_to_keep") if k in forward_params), None)

    # ------------------------------------------------------------------ public API

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        meta = prompts.meta_info
        params = self.sampling_params(meta)
        response_length = int(meta.get("response_length", _cfg(self.config, "response_length")))
        eos_ids, pad_id = special_tokens(self.module, meta, "HFRollout")
        generator = self._generator_for(meta)

        batch_size = len(prompts)
        micro = int(self.micro_batch_size or batch_size)
        parts = [prompts] if micro >= batch_size else prompts.split(micro)
        passes = self._agreed_passes(len(parts))
        static = self.static_unsupported() is None
        decoder: list = [None, None]  # (shape key, StaticDecoder): one at a time, reused by equal chunks
        outputs = []
        was_training = self.module.training
        self.module.eval()
        try:
            with torch.no_grad(), self._autocast():
                for i in range(passes):
                    holder = decoder if static else None
                    if i < len(parts):
                        outputs.append(self._generate(parts[i], params, response_length, eos_ids, pad_id, generator,
                                                      holder))
                    else:  # this rank ran out of rows: a discarded one-row pass keeps the gathers matched
                        self._generate(parts[-1][:1], params, response_length, eos_ids, pad_id, generator, holder)
        finally:
            self.module.train(was_training)
        return outputs[0] if len(outputs) == 1 else DataProto.concat(outputs)

    def sampling_params(self, meta_info: dict) -> SamplingParams:
        """Training settings, or `val_kwargs` when meta_info['validate'] is true; explicit
        meta_info keys (do_sample, temperature, top_k, top_p) override either."""
        source = self.config.val_kwargs if meta_info.get("validate", False) else self.config
        return SamplingParams(
            do_sample=bool(meta_info.get("do_sample", _cfg(source, "do_sample", True))),
            temperature=float(meta_info.get("temperature", _cfg(source, "temperature", 1.0))),
            top_k=int(meta_info.get("top_k", _cfg(source, "top_k", 0))),
            top_p=float(meta_info.get("top_p", _cfg(source, "top_p", 1.0))),
        )

    def get_rng_state(self) -> torch.Tensor | None:
        """The kept sampling stream's state (None before its first use), for checkpoints."""
        return None if self._generator is None else self._generator.get_state()

    def set_rng_state(self, state: torch.Tensor | None) -> None:
        """Continue the kept sampling stream from `get_rng_state()`'s value (None: seed it afresh)."""
        self._generator = None
        if state is not None:
            self._generator = torch.Generator(device=self._device())
            self._generator.set_state(state)

    def static_unsupported(self) -> str | None:
        """Why generation must call the HF forward instead of the static decoder (None: it need not)."""
        if _is_sharded(self.module):
            return "the weights are sharded (each forward gathers them)"
        return static_decoding_unsupported(inner_module(self.module))

    # ------------------------------------------------------------------ internals

    def _device(self) -> torch.device:
        return next(self.module.parameters()).device

    def _generator_for(self, meta: dict) -> torch.Generator:
        """A per-call generator when meta_info carries a seed, else one stream kept across calls.

        The kept stream is seeded with rollout.seed plus the rank, so data-parallel ranks differ
        and a rerun with the same seed reproduces every step.
        """
        device = self._device()
        if "seed" in meta:
            return torch.Generator(device=device).manual_seed(int(meta["seed"]))
        if self._generator is None:
            rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
            self._generator = torch.Generator(device=device).manual_seed(int(_cfg(self.config, "seed", 0)) + rank)
        return self._generator

    def _autocast(self):
        dtype = rollout_autocast_dtype(self.dtype, compute_dtype_of(self.module))
        if dtype is None:
            return contextlib.nullcontext()
        # no weight-cast cache: a recorded CUDA graph must recompute its casts on every replay
        return torch.autocast(device_type=self._device().type, dtype=dtype, cache_enabled=False)

    def _forward(self, input_ids, attention_mask, position_ids, cache, images: dict | None = None):
        kwargs = {self._cache_kw: cache, "use_cache": True, **(images or {})}
        if self._keep_kw is not None:
            kwargs[self._keep_kw] = 1  # only the last position's logits are needed
        if position_ids.dim() == 3:  # a VL model's (batch, 4, seq) positions: the model takes (4, batch, seq)
            position_ids = position_ids.transpose(0, 1)
        out = self.module(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, **kwargs)
        new_cache = getattr(out, "cache", None) if self._cache_kw == "cache" else out.past_key_values
        return out.logits[:, -1, :], new_cache

    def _hf_passes(self, ids, mask, pos, images: dict | None = None):
        """First logits and a next-step function over the HF forward and its growing cache. `images`
        (pixel_values, image_grid_thw) go into the prefill only: the cache then holds their features."""
        state = {"mask": mask, "cache": None}
        logits, state["cache"] = self._forward(ids, mask, pos, None, images)

        def advance(token, step, rows=None):   # rows: always None here (the HF cache keeps every row)
            state["mask"] = torch.cat([state["mask"], torch.ones_like(mask[:, :1])], dim=-1)
            logits, state["cache"] = self._forward(token.unsqueeze(-1), state["mask"], pos[..., -1:] + step + 1,
                                                   state["cache"])
            return logits

        return logits, advance

    def _static_passes(self, holder: list, ids, mask, pos, response_length, images: dict | None = None):
        """First logits and a next-step function over a StaticDecoder (kept in `holder` for equal chunks),
        on the prompts without their common left padding. The next-step function takes the batch's tokens
        and `rows`: the batch rows still in the decoder (None: all), as `_leave` left them.

        With a VL model's (batch, 4, seq) positions the prefill is the model's own forward (`images` and
        the multimodal positions go in there) and its cache is copied into the decoder's. Each new token
        then sits at the next mrope position: one past the row's largest, as the model's own generation
        places text after the prompt (for a prompt ending in text, its last column's mrope position)."""
        ids, mask, pos = trim_common_padding(ids, mask, pos)
        batch, prompt_length = ids.shape
        positions = max(int(pos.max()) + 1, prompt_length) + response_length
        key = (batch, prompt_length + response_length, positions)
        if holder[0] != key:
            holder[:] = [None, None]  # free the previous cache before allocating the next
            weights = compute_dtype_of(self.module)
            dtype = rollout_autocast_dtype(self.dtype, weights) or weights
            device = ids.device
            graphs = self.cuda_graphs and device.type == "cuda"
            decoder = StaticDecoder(inner_module(self.module), batch, key[1], positions, dtype, device, graphs,
                                    self.compile_backend, step=self._step, fused=self.fused_projections)
            holder[:] = [key, decoder]
        decoder = holder[1]
        if pos.dim() == 3:  # rows 1-3 are the (temporal, height, width) mrope positions
            last = pos[:, 1:].amax(dim=(1, 2))
            logits, cache = self._forward(ids, mask, pos, None, images)
            decoder.load_prefix([(layer.keys, layer.values) for layer in cache.layers], mask)
            del cache  # the prompt's keys and values now live in the decoder's cache only
        else:
            last = pos[:, -1]
            logits = decoder.prefill(ids, mask, pos)

        def advance(token, step, rows=None):
            if rows is None:
                return decoder.decode(token, last + step + 1, prompt_length + step)
            return decoder.decode(token.index_select(0, rows), last.index_select(0, rows) + step + 1,
                                  prompt_length + step)

        return logits, advance

    def _generate(self, prompts: DataProto, params, response_length, eos_ids, pad_id, generator, holder) -> DataProto:
        """One chunk. `holder` is the static decoder slot, or None to run the HF forward."""
        device = self._device()
        prompt_ids = prompts.batch["input_ids"]
        prompt_mask = prompts.batch["attention_mask"]
        prompt_pos = prompts.batch["position_ids"]
        out_device = prompt_ids.device
        ids, mask, pos = prompt_ids.to(device), prompt_mask.to(device), prompt_pos.to(device)

        batch_size = ids.shape[0]
        ignore_eos = bool(_cfg(self.config, "ignore_eos", False))
        eos = torch.tensor(eos_ids, device=device)
        lockstep = _is_sharded(self.module)
        responses = torch.full((batch_size, response_length), pad_id, dtype=ids.dtype, device=device)
        finished = torch.zeros(batch_size, dtype=torch.bool, device=device)
        finish_step = torch.zeros(batch_size, dtype=torch.long, device=device)  # a running row's: the current step
        # The sampling stream's state after each step since the last EOS check: steps run past the
        # last EOS are undone from it, so the stream continues as if decoding had stopped right there.
        states, since = [], 0
        keep_states = not ignore_eos and not params.greedy

        images = _image_inputs(prompts, device)
        if holder is None:
            logits, advance = self._hf_passes(ids, mask, pos, images)
        else:
            logits, advance = self._static_passes(holder, ids, mask, pos, response_length, images)
        leaving = holder is not None and LEAVE_WHEN_HALF_FINISHED
        rows = None  # the batch rows the static decoder still runs, once finished ones have left it (None: all)
        for step in range(response_length):
            token = sample_next_token(logits, params, generator, self._race)
            if rows is not None:
                token = torch.full((batch_size,), pad_id, dtype=token.dtype, device=device).index_copy_(0, rows, token)
            token = torch.where(finished, torch.full_like(token, pad_id), token)
            responses[:, step] = token
            last_step = step + 1 == response_length
            if not ignore_eos:
                finish_step = torch.where(finished, finish_step, step)
                finished |= torch.isin(token, eos)
                if keep_states:
                    states.append(generator.get_state())
                leave = leaving and leave_due(step)
                if last_step or leave or eos_check_due(step):
                    done, running = self._all_finished(finished, finish_step, lockstep)
                    if done is not None:
                        if keep_states:
                            generator.set_state(states[done - since])
                        break
                    states, since = [], step + 1
                    if leave:
                        rows = self._leave(holder[1], finished, rows, running)
            if last_step:
                break
            logits = advance(token, step, rows)

        tensors = output_tensors(ids, mask, pos, responses, eos_ids, ignore_eos)
        tensors = {k: v.to(out_device) for k, v in tensors.items()}
        # The pixel tensors stay with the caller's batch (it keeps its own copy for the log-prob passes).
        non_tensors = {k: v for k, v in prompts.non_tensor_batch.items() if k != "multi_modal_inputs"}
        return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info=dict(prompts.meta_info))

    def _agreed_passes(self, passes: int) -> int:
        """With sharded weights every forward is a collective, so every rank must run as many passes
        as the busiest one; the dispatcher's chunks may differ by a row, and so may their pass counts."""
        if not _is_sharded(self.module):
            return passes
        count = torch.tensor([passes], dtype=torch.int64, device=self._device())
        dist.all_reduce(count, op=dist.ReduceOp.MAX)
        return int(count.item())

    @staticmethod
    def _all_finished(finished: torch.Tensor, finish_step: torch.Tensor, lockstep: bool) -> tuple[int | None, int]:
        """(The step at which the last row emitted EOS, or None while a row runs on; under sharded weights,
        over every rank's rows (each rank must call it at the same steps). How many of this rank's rows
        run on.) One read from the device."""
        unfinished = torch.iinfo(torch.int64).max
        last = torch.where(finished.all(), finish_step.max(), unfinished).reshape(1)
        if lockstep:
            dist.all_reduce(last, op=dist.ReduceOp.MAX)
        value, running = torch.cat([last, (~finished).sum().reshape(1)]).tolist()
        return (None if value == unfinished else value), running

    @staticmethod
    def _leave(decoder: StaticDecoder, finished: torch.Tensor, rows: torch.Tensor | None, running: int):
        """The batch rows to decode from here on (`rows` of `_generate`). When at most half the decoder's rows
        still run, the finished ones leave it (`StaticDecoder.keep_rows`), down to the next count of the
        halving sequence of the batch (batch, then each half rounded up) that holds the running rows,
        finished rows filling the rest: so row counts, and the graphs recorded for each, are few and
        repeat from chunk to chunk and call to call."""
        count = decoder.rows
        while running <= -(-count // 2) < count:
            count = -(-count // 2)
        if count == decoder.rows:
            return rows
        done = finished if rows is None else finished.index_select(0, rows)   # per decoder row
        keep = torch.argsort(done.to(torch.int8), stable=True)[:count].sort().values   # running rows first
        decoder.keep_rows(keep)
        return keep if rows is None else rows.index_select(0, keep)
