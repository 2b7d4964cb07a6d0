"""Memory model: predicted peak device memory of one PPO step, per phase, for a plan and a model.

Pure arithmetic on `ModelSpec` and the role plans; no torch. `predicted_peak_gb` is the peak of tensor
allocations (what `torch.cuda.max_memory_allocated` reports); `required_gb` adds the CUDA context and a
fragmentation margin, and is what the planner fits into the device. Every term, its formula and its
calibration: docs/compat.md, "The memory model".
"""
from __future__ import annotations

from dataclasses import dataclass, field

from verl.compat.planning.model_spec import ModelSpec
from verl.compat.planning.vision import BYTES, tower_forward_bytes, tower_saved_bytes
from verl.compat.plan import RolePlan, RolloutPlan

GiB = 1024 ** 3
LOGPROB_CHUNK_ROWS = 1024        # rows per float32 chunk in verl.utils.torch_functional
CUDA_CONTEXT_GB = 0.75           # CUDA context and kernel images, outside the allocator's count (cuBLAS
                                 # workspaces are inside it, in each phase's terms)
# foreach AdamW temporaries, in units of one fp32 shard of params. The fused kernel updates in place; only
# FSDP2-wrapped roles with offloaded state keep the scratch (docs/compat.md, "Memory model", has the runs).
ADAM_STEP_SCRATCH = 1.0
NF4_BYTES = 0.5 + 4 / 64   # 4-bit codes plus one float32 absmax per 64-weight block (no double quantization)
# AdamW8bit's two moments, one byte each, plus each moment's float32 absmax per 256-value block (bitsandbytes'
# block-wise quantisation); the step updates them in place (no scratch the size of the model)
ADAMW8BIT_BYTES = 2 + 2 * 4 / 256
ENGINE_TERMS = ("rollout.kv_cache", "rollout.prefill", "rollout.sampling", "rollout.engine share", "rollout.vision tower")


@dataclass(frozen=True)
class Workload:
    """The step's shape: sequence lengths and how many sequences each device generates."""

    prompt_length: int
    response_length: int
    rollout_batch_per_gpu: int
    world_size: int = 1
    val_batch_per_gpu: int | None = None   # sequences per validation call; None: the whole set (unknown)
    update_batch_per_gpu: int | None = None         # sequences per actor mini-batch; None: the rollout batch
    critic_update_batch_per_gpu: int | None = None  # the critic's; None: the actor's
    image_tokens: int = 0    # a VL model's image tokens per sequence, at most (they are part of the prompt)
    generates: bool = True   # False: the run samples nothing (SFT), so it has no rollout or validation phase

    @property
    def seq_len(self) -> int:
        return self.prompt_length + self.response_length

    def sequences_seen(self, role: str, forward: bool) -> int:
        """The most sequences one micro-batch of `role` can hold: a forward (log-probs, values) is
        handed the device's whole rollout batch, an update one mini-batch at a time."""
        batch = self.rollout_batch_per_gpu
        if forward:
            return batch
        mini = self.critic_update_batch_per_gpu if role == "critic" else None
        return min(mini or self.update_batch_per_gpu or batch, batch)


@dataclass
class PhaseMemory:
    """Allocated bytes (GiB) by term at the peak of one phase."""

    name: str
    terms: dict[str, float] = field(default_factory=dict)

    @property
    def total_gb(self) -> float:
        return sum(self.terms.values())


@dataclass
class MemoryEstimate:
    phases: dict[str, PhaseMemory]
    context_gb: float
    fragmentation: float

    @property
    def peak_phase(self) -> str:
        return max(self.phases.values(), key=lambda p: p.total_gb).name

    @property
    def predicted_peak_gb(self) -> float:
        return max(p.total_gb for p in self.phases.values())

    @property
    def required_gb(self) -> float:
        return self.predicted_peak_gb * (1 + self.fragmentation) + self.context_gb

    def room_gb(self, limit_gb: float) -> float:
        """The largest phase peak a device of `limit_gb` holds (`required_gb` solved for the peak)."""
        return (limit_gb - self.context_gb) / (1 + self.fragmentation)

    def rollout_resident_gb(self) -> float:
        """What stays allocated while generating: everything in the rollout phase except the
        engine's own memory (its per-sequence terms, or vLLM's share); 0 for a run that generates nothing."""
        rollout = self.phases.get("rollout")
        return sum(v for k, v in rollout.terms.items() if k not in ENGINE_TERMS) if rollout else 0.0

    def generation_peak_gb(self) -> float:
        """The engine's peak (training rollout or validation); 0 for a run that generates nothing."""
        return max((self.phases[k].total_gb for k in ("rollout", "validation") if k in self.phases), default=0.0)

    def to_dict(self) -> dict:
        out = {name: {k: round(v, 4) for k, v in p.terms.items()} for name, p in self.phases.items()}
        return {"phases": out, "peak_phase": self.peak_phase, "context_gb": self.context_gb,
                "fragmentation": self.fragmentation,
                "predicted_peak_gb": round(self.predicted_peak_gb, 3),
                "required_gb": round(self.required_gb, 3)}

    def table(self) -> str:
        """Human-readable breakdown, one phase per block (the doctor prints this)."""
        lines = []
        for p in self.phases.values():
            mark = "  <- peak" if p.name == self.peak_phase else ""
            lines.append(f"{p.name:14s} {p.total_gb:8.2f} GiB{mark}")
            lines += [f"    {k:28s} {v:8.3f}" for k, v in p.terms.items() if v > 0.0005]
        lines.append(f"context {self.context_gb:.2f} GiB, fragmentation {self.fragmentation:.0%}, "
                     f"required {self.required_gb:.2f} GiB")
        return "\n".join(lines)


# ----------------------------------------------------------------------------- per-token terms

def layer_activation_bytes(model: ModelSpec, compute: str, residual: str, attn: str, seq_len: int) -> float:
    """Bytes one decoder layer saves for backward, per token (docs/compat.md, "The memory model")."""
    c, r = BYTES[compute], BYTES[residual]
    h, q, kv = model.hidden_size, model.num_heads * model.head_dim, model.num_kv_heads * model.head_dim
    norms = 2 * (2 * h * r + h * c)
    attention = (2 * q + 2 * kv + 2 * q) * c + 4 * model.num_heads
    if attn == "eager":
        attention += model.num_heads * seq_len * (4 + c)
    if attn == "torch_varlen":   # torch releases without enable_gqa get k/v copied out to every query head
        attention += 2 * (q - kv) * c
    mlp = 4 * model.intermediate_size * c
    return norms + attention + mlp


def _logprob_scratch(model: ModelSpec, response_tokens: int, compute: str, backward: bool, fused: bool) -> float:
    """float32 scratch of the chunked log-prob pass (`verl.utils.torch_functional`), one chunk of
    rows at a time. Forward: at most two float32 chunks (a float32 copy of half logits and the
    exponentials; log-sum-exp's difference and exponential). Backward: a float32 copy of the chunk turned
    into the softmax in place, plus, for half logits, the product's float32 result before it is cast
    into the half gradient (an `out=` of another dtype). Compiled chunk kernels (`fused`) hold nothing
    in forward and return each chunk's gradient in the logits' dtype."""
    chunk = min(response_tokens, LOGPROB_CHUNK_ROWS) * model.vocab_size
    if fused:
        return chunk * BYTES[compute] if backward else 0.0
    return chunk * 4 * (2 if BYTES[compute] < 4 or not backward else 1)


def _vocab_grad_bytes(model: ModelSpec, role: _Role, accumulates: bool) -> float:
    """Backward materialises (vocab x hidden) gradients whole before FSDP2 reduces them into .grad.

    Tied embeddings get two (output projection and dense embedding gradient) plus their sum, all in
    the master dtype. Untied, the output projection's gradient exists in compute dtype and then in
    the master dtype, one matrix at a time. A critic has only the embedding's, plus the copy FSDP2
    reduces from.

    An unwrapped model's .grad is in the grads term already, and its input embedding adds rows into
    it (`fsdp_utils.rows_into_grad`): nothing more at the end of backward, except that a tied output
    projection's gradient, once `accumulates` (a later micro-batch of the mini-batch), exists next to
    the .grad it is added to."""
    if role.lora:   # the embeddings and the output projection are frozen: no vocabulary-sized gradient
        return 0.0
    vh = model.vocab_size * model.hidden_size
    master, compute = BYTES[role.plan.param_dtype], BYTES[role.plan.compute_dtype]
    untied = vh * (master + (compute if compute != master else 0))
    if not role.plan.fsdp:
        if role.name == "critic":
            return 0.0
        if model.tie_word_embeddings:
            return vh * master if accumulates else 0.0
        return untied
    if role.name == "critic":
        return 2 * vh * master
    if model.tie_word_embeddings:
        return 3 * vh * master
    return untied


def _generation_terms(model: ModelSpec, actor: RolePlan, rollout: RolloutPlan, prompt_length: int,
                      response_length: int, image_tokens: int = 0) -> tuple[dict[str, float], ...]:
    """Bytes the built-in engine adds per generated sequence at its candidate peaks: the end of
    prefill (the whole KV cache, which the static decoder allocates up front, plus one layer's
    transients over the prompt), the end of decoding (full KV, float32 sampling over the last
    position's logits), and for a VL model the vision tower's forward over the prompt's images
    at the prefill (`vision_bytes`; the KV cache counted beside it as well). A VL prefill is the model's
    own forward, whose cache over the prompt is held beside the decoder's until copied into it.

    Prefill transients per token: 4H*r + 3I*c, plus 4I under autocast, with c the rollout dtype and r the residual width: that of
    the weights the engine computes with, the gathered ones (`gather_dtype`), so a plan that casts
    on gather generates in the rollout dtype without autocast (r = c)."""
    c = BYTES[rollout.dtype]
    weights = read_dtype(actor)
    r = max(c, BYTES[weights])
    h, inter = model.hidden_size, model.intermediate_size
    kv_per_token = 2 * model.num_layers * model.num_kv_heads * model.head_dim * c
    autocast = rollout.dtype != weights and not actor.lora_rank   # a LoRA base is upcast per matmul, not autocast
    per_token = 4 * h * r + 3 * inter * c + (4 * inter if autocast else 0)
    if rollout.attn_implementation == "eager":
        per_token += model.num_heads * prompt_length * (4 + c)
    kv_cache = kv_per_token * (prompt_length + response_length)
    prefill = {"rollout.kv_cache": kv_cache, "rollout.prefill": prompt_length * per_token}
    decode = {"rollout.kv_cache": kv_cache,
              "rollout.sampling": model.vocab_size * 4 * 3}
    if model.vision is None:
        return prefill, decode
    prefill["rollout.prefill_cache"] = kv_per_token * prompt_length
    if not image_tokens:
        return prefill, decode
    tower = vision_bytes(model, rollout.dtype, weights, rollout.attn_implementation, 1, image_tokens, "forward")
    return prefill, decode, {"rollout.kv_cache": kv_cache, "rollout.vision tower": tower}


def vision_bytes(model: ModelSpec, compute: str, weights: str, attn: str, rows: int, image_tokens: int,
                 kept: str) -> float:
    """A VL model's vision tower over `rows` sequences of `image_tokens` image tokens each (the largest image
    one sequence's whole share): the pixel values (float32) plus, by `kept`, its forward without gradients
    ("forward"), what a trained tower saves for backward ("saved", "checkpointed"), or nothing ("frozen")."""
    v = model.vision
    image = image_tokens * v.patches_per_token
    patches = rows * image
    pixels = patches * v.patch_features * 4
    if kept == "forward":
        return pixels + tower_forward_bytes(v, compute, weights, attn, patches, image)
    if kept == "frozen":
        return pixels
    return pixels + tower_saved_bytes(v, compute, weights, attn, patches, image, checkpointed=kept == "checkpointed")


def generation_bytes_per_sequence(model: ModelSpec, actor: RolePlan, rollout: RolloutPlan, prompt_length: int,
                                  response_length: int, image_tokens: int = 0) -> float:
    """Peak bytes one more sequence costs the built-in engine; generation memory is linear in the
    sequences generated together, so the planner divides free memory by this to size its chunks."""
    return max(sum(t.values()) for t in _generation_terms(model, actor, rollout, prompt_length, response_length,
                                                          image_tokens))


def _builtin_rollout(model: ModelSpec, actor: _Role, workload: Workload, rollout: RolloutPlan,
                     batch: int | None) -> dict[str, float]:
    """The actor's weights as the engine computes with them, plus one chunk of sequences
    (`rollout.micro_batch_size` of them, or the whole batch when that is smaller or unset;
    `batch` None: a batch of unknown size, i.e. at least one full chunk)."""
    if batch is None:
        batch = rollout.micro_batch_size or workload.rollout_batch_per_gpu
    chunk = min(batch, rollout.micro_batch_size or batch)
    peak = max(_generation_terms(model, actor.plan, rollout, workload.prompt_length, workload.response_length,
                                 workload.image_tokens), key=lambda t: sum(t.values()))
    return {**_generation_weights(model, actor, rollout), **{k: v * chunk for k, v in peak.items()}}


def _generation_weights(model: ModelSpec, actor: _Role, rollout: RolloutPlan) -> dict[str, float]:
    """The whole actor unsharded in its gather dtype (`fsdp_utils.full_params`; nothing for an unwrapped
    model, whose stored weights the engine reads), plus, when the
    engine computes in another dtype, autocast's cast of the largest weight: the engine runs
    autocast without its weight cache (a recorded CUDA graph must recast on every replay), so each
    matmul casts its weight for that op only, and the output projection (vocab x hidden) is the
    largest: one such copy, not the whole model."""
    stored = read_dtype(actor.plan)
    gather = rollout.dtype if actor.lora else gather_dtype(actor.plan)   # a LoRA model gathers in compute dtype
    cast = model.vocab_size * model.hidden_size * BYTES[rollout.dtype] if stored != rollout.dtype else 0.0
    gathered = (actor.params + actor.adapters) * BYTES[gather] if actor.plan.fsdp else 0.0   # unwrapped: in place
    terms = {"rollout.gathered weights": gathered, "rollout.weights": cast + _dequantized(model, actor, rollout.dtype)}
    if rollout.fused_projections:
        terms["rollout.fused weights"] = fused_copy_gb(model, rollout.dtype) * GiB
    return terms


def fused_copy_gb(model: ModelSpec, dtype: str) -> float:
    """GiB of the built-in engine's fused decode weights (`rollout.fused_projections`): every layer's q/k/v
    and gate/up matrices, copied side by side in the rollout dtype."""
    h, q, kv = model.hidden_size, model.num_heads * model.head_dim, model.num_kv_heads * model.head_dim
    return model.num_layers * h * (q + 2 * kv + 2 * model.intermediate_size) * BYTES[dtype] / GiB


def _dequantized(model: ModelSpec, role: _Role, dtype: str) -> float:
    """A 4-bit base is dequantized one linear layer at a time for its matmul: the largest such weight."""
    if not role.quantized:
        return 0.0
    return max(i * o for i, o in model.linear_shapes()) * BYTES[dtype]


# ----------------------------------------------------------------------------- roles

@dataclass(frozen=True)
class _Role:
    name: str
    plan: RolePlan
    params: int        # every parameter of the model (a LoRA role's base)
    trainable: bool
    adapters: int = 0  # LoRA adapter parameters (with a critic's value head): what trains when lora_rank > 0
    quantized: int = 0  # base parameters stored in 4 bits (the decoder's linear weights under nf4)

    @property
    def lora(self) -> bool:
        return self.plan.lora_rank > 0

    @property
    def trained(self) -> int:
        """Parameters with gradients and optimizer states: the adapters of a LoRA role, else all or none."""
        if not self.trainable:
            return 0
        return self.adapters if self.lora else self.params

    def weights(self, world_size: int) -> float:
        """Stored weights: a full trained role in its master dtype; a frozen model or a LoRA base in
        `frozen_dtype` (4-bit linear weights under nf4), a LoRA role's adapters in the master dtype."""
        p = self.plan
        if self.trainable and not self.lora:
            return self.params * BYTES[p.param_dtype] / world_size
        frozen = BYTES[p.frozen_dtype or p.param_dtype]
        base = (self.params - self.quantized) * frozen + self.quantized * NF4_BYTES
        return (base + self.adapters * BYTES[p.param_dtype]) / world_size

    def optimizer(self, world_size: int) -> float:
        if not self.trainable:
            return 0.0
        moments = ADAMW8BIT_BYTES if self.plan.optimizer_8bit else 8
        master = 4 if BYTES[self.plan.param_dtype] < 4 else 0
        return self.trained * (moments + master) / world_size

    def grads(self, world_size: int) -> float:
        return self.trained * BYTES[self.plan.param_dtype] / world_size

    def on_host(self) -> tuple[bool, bool]:
        """(weights, optimizer) kept in host memory. Under param offload FSDP2's CPUOffloadPolicy keeps
        shards and their gradients on the host and AdamW steps them there: the states never come over."""
        return self.plan.param_offload, self.plan.optimizer_offload or self.plan.param_offload

    def resident(self, world_size: int) -> dict[str, float]:
        """What stays on the device while another role is active."""
        weights_home, optimizer_home = self.on_host()
        return {f"{self.name}.weights": 0.0 if weights_home else self.weights(world_size),
                f"{self.name}.optimizer": 0.0 if optimizer_home else self.optimizer(world_size)}


def read_dtype(plan: RolePlan, trainable: bool = True) -> str:
    """The dtype a role's weights are read in where they are stored: a LoRA base's or a frozen model's
    `frozen_dtype`, else the gather dtype (`gather_dtype`)."""
    if plan.lora_rank or not trainable:
        return plan.frozen_dtype or plan.param_dtype
    return gather_dtype(plan)


def gather_dtype(plan: RolePlan) -> str:
    """The dtype FSDP2 all-gathers a role's weights in: the plan's `cast_on_gather` decides (compute
    dtype when set, else the parameter dtype, with autocast casting each weight as it is used; the
    planner already weighed the rollout dtype in `cast_on_gather`)."""
    return plan.compute_dtype if plan.cast_on_gather else plan.param_dtype


def _root_unit(model: ModelSpec, role: _Role) -> int:
    """Parameters in FSDP2's root unit: the vocabulary-sized ones (embedding; output projection
    unless tied or a critic's)."""
    return model.vocab_size * model.hidden_size * (1 if model.tie_word_embeddings or role.name == "critic" else 2)


def _compute_copy(model: ModelSpec, role: _Role, dtype: str, train: bool = False, compiled: bool = False,
                  layers: int = 2, checkpointed: bool = False) -> float:
    """Weights materialised for compute: the FSDP2 all-gathered units (root plus `layers` prefetched
    layers: two inside the decoder, none at the output projection, where only the root is gathered) in
    the gather dtype, at every world size (FSDP2 copies on one device too); in an update whose plan does
    not reshard after forward, every unit instead (each layer stays gathered from its forward to its
    backward; forwards without gradients reshard as they go, `fsdp_utils.shard_model`), and in forwards
    whose plan gathers the model once per call (`gather_for_forward`); none for an unwrapped model. Plus
    autocast's casts when the weights are read in another dtype than `dtype` (an unwrapped model reads
    them as stored, in its parameter dtype). Autocast caches the cast of a leaf weight that requires grad
    for the whole forward: a trained role holds a cast copy of its weights until autocast exits; from then
    on (`checkpointed`: in backward under checkpointing) only the casts saved for backward outside the
    checkpointed layers stay, the output projection's. A frozen one (the reference), and a trained one's
    forward without gradients through compiled layers (`compiled`: each layer's graph casts its own
    weights), cast op by op, the output projection the largest at once."""
    if role.lora or (not role.trainable and read_dtype(role.plan, False) != role.plan.param_dtype):
        return _frozen_compute_copy(model, role, dtype, train, layers)
    gather = gather_dtype(role.plan) if role.plan.fsdp else role.plan.param_dtype
    units = _gathered_units(model, role, dtype, train, layers)
    if gather == dtype:
        return units
    embedding = model.vocab_size * model.hidden_size
    if not role.trainable or (compiled and not train) or checkpointed:
        return units + embedding * BYTES[dtype]
    casted = role.params - (embedding if (role.name == "critic" or not model.tie_word_embeddings) else 0)
    return units + casted * BYTES[dtype]


def _gathered_units(model: ModelSpec, role: _Role, dtype: str, train: bool, layers: int) -> float:
    """FSDP2's gathered units (none unwrapped): the root plus `layers` layers, or every unit where the plan
    keeps them; in the gather dtype (a LoRA role's or a mixed-dtype frozen model's: the compute dtype)."""
    plan = role.plan
    if not plan.fsdp:
        return 0.0
    mixed = role.lora or (not role.trainable and read_dtype(plan, False) != plan.param_dtype)
    width = BYTES[dtype] if mixed else BYTES[gather_dtype(plan)]
    total = role.params + role.adapters
    root = _root_unit(model, role)
    kept = (not plan.reshard_after_forward) if train else plan.gather_for_forward
    return (total if kept else root + layers * (total - root) / model.num_layers) * width


def _frozen_compute_copy(model: ModelSpec, role: _Role, dtype: str, train: bool, layers: int = 2) -> float:
    """Weights materialised for compute by a LoRA role or a reference stored in another dtype than its
    parameter dtype (`frozen_dtype`). Wrapped, FSDP2 gathers its units (root plus `layers` prefetched
    layers; every unit where the plan keeps them) in the compute dtype. Unwrapped, the weights are read where they
    are stored: a weight stored in another dtype is cast at its own matmul and only for it
    (`frozen_weights.upcast_frozen`; the output projection is the largest at once), a 4-bit one
    dequantized per linear layer, and autocast caches its casts of the trainable adapters."""
    plan, c = role.plan, BYTES[dtype]
    if plan.fsdp:
        return _gathered_units(model, role, dtype, train, layers)
    upcast = model.vocab_size * model.hidden_size * c if read_dtype(plan, role.trainable) != dtype else 0.0
    adapters = role.adapters * c if train and plan.param_dtype != dtype else 0.0
    return upcast + _dequantized(model, role, dtype) + adapters


def _tokens(plan: RolePlan, workload: Workload, role: str, forward: bool) -> tuple[int, int, int]:
    """(tokens, response tokens, sequences) in the largest micro-batch of this role: its size, or
    as many full-length sequences as its token budget holds, but never more sequences than the
    role is handed at once (`Workload.sequences_seen`). Full length (prompt + response) is the
    worst case of both splitters: the padded one trims each micro-batch to its longest prompt and
    response, the packed one counts real tokens."""
    seq_len, response_len = workload.seq_len, workload.response_length
    seen = workload.sequences_seen(role, forward)
    mbs = plan.forward_micro_batch_size_per_gpu if forward else plan.micro_batch_size_per_gpu
    if mbs is None and forward:
        mbs = plan.micro_batch_size_per_gpu
    if mbs is not None:
        rows = min(mbs, seen)
        return rows * seq_len, rows * response_len, rows
    budget = (plan.forward_max_token_len_per_gpu if forward else None) or plan.max_token_len_per_gpu or seq_len
    rows = min(max(budget // seq_len, 1), seen)
    return rows * seq_len, rows * response_len, rows


# Share of an eager layer's saved-for-backward bytes a compiled layer keeps (torch.compile's min-cut
# partitioner recomputes cheap elementwise ops in backward instead of saving their outputs), by compute
# dtype size. Measured on CPU for the Qwen2.5-0.5B layer (`tests/compat/test_compiled_activations.py`):
# 0.706 in bfloat16, 0.753 in float32; rounded up.
COMPILED_ACTIVATION_SHARE = {2: 0.72, 4: 0.77}


def _head_rows(plan: RolePlan, tokens: int, response_tokens: int) -> tuple[int, int]:
    """(token rows, rows through the LM head) of one rank: under Ulysses each rank runs 1/sp of the
    tokens and takes the head's output at all of them (log-probs are gathered over the group after)."""
    sp = plan.sequence_parallel_size
    return (tokens, response_tokens) if sp == 1 else (-(-tokens // sp), -(-tokens // sp))


def layer_forward_bytes(model: ModelSpec, compute: str, residual: str, attn: str, seq_len: int) -> float:
    """Bytes per token a decoder layer holds at once in a forward without gradients: the residual
    stream and its normalised copy, then the larger of attention's q, k, v and output (q and k twice
    around the rotary embedding) and the MLP's three intermediates (gate's activation, up, their
    product); eager attention's T x T scores on top. Nothing is saved from one layer to the next."""
    c, r = BYTES[compute], BYTES[residual]
    q, kv = model.num_heads * model.head_dim, model.num_kv_heads * model.head_dim
    scores = model.num_heads * seq_len * (4 + c) if attn == "eager" else 0
    return 2 * model.hidden_size * r + max((3 * q + 3 * kv) * c + scores, 3 * model.intermediate_size * c)


def residual_dtype(plan: RolePlan) -> str:
    """The residual stream's dtype in training: that of the weights the layers compute with (the gathered
    ones; an unwrapped full model's as stored, autocast casting each matmul; a LoRA base's frozen dtype)."""
    if plan.fsdp or plan.lora_rank:
        return read_dtype(plan)
    return plan.param_dtype


def _activations(model: ModelSpec, plan: RolePlan, tokens: int, seq_len: int, train: bool,
                 compiled: bool = False, recomputing: bool = True) -> dict[str, float]:
    """Activations of a micro-batch of `tokens`: without gradients one layer's transients; in training
    what backward needs, with checkpointing the layer inputs plus, while a layer is being recomputed
    (`recomputing`), its saved activations and their gradients (2 layers)."""
    residual = residual_dtype(plan) if train else plan.compute_dtype
    tokens = -(-tokens // plan.sequence_parallel_size)   # Ulysses: each rank holds 1/sp of the sequence
    if not train:
        return {"activations (1 layer)": tokens * layer_forward_bytes(model, plan.compute_dtype, residual,
                                                                      plan.attn_implementation, seq_len)}
    per_layer = layer_activation_bytes(model, plan.compute_dtype, residual, plan.attn_implementation, seq_len)
    if plan.lora_rank:   # each adapted linear layer saves its rank-r intermediate for lora_B
        per_layer += len(model.linear_shapes()) * plan.lora_rank * BYTES[plan.compute_dtype]
    if compiled:
        per_layer *= COMPILED_ACTIVATION_SHARE[BYTES[plan.compute_dtype]]
    layer = tokens * per_layer
    if plan.gradient_checkpointing:
        inputs = tokens * model.hidden_size * BYTES[residual] * model.num_layers
        return {"activations (checkpointed)": inputs + (2 * layer if recomputing else 0.0)}
    return {"activations": layer * model.num_layers + (layer if recomputing else 0.0)}


# ----------------------------------------------------------------------------- phases

@dataclass(frozen=True)
class _Step:
    """What every phase builder reads: the models, the step's shape, the roles and the engine."""

    model: ModelSpec
    critic_model: ModelSpec
    workload: Workload
    roles: dict[str, _Role]
    rollout: RolloutPlan
    device_memory_gb: float
    compiled_layers: bool = False   # the plan's torch_compile: decoder layers compiled for training
    reward_model: _RewardModel | None = None

    def spec(self, name: str) -> ModelSpec:
        return self.critic_model if name == "critic" else self.model

    def idle(self, active: str) -> dict[str, float]:
        """What the roles other than `active` keep on the device (a reward model kept there included)."""
        out = {}
        for name, role in self.roles.items():
            if name != active:
                out.update(role.resident(self.workload.world_size))
        if self.reward_model is not None and active != REWARD_MODEL:
            out.update(self.reward_model.resident())
        return out

    def on_device(self, role: _Role) -> dict[str, float]:
        """The active role's own state on the device: its weights and optimizer states unless they live
        in host memory (an offloaded optimizer comes over for its step only, counted in the update)."""
        return role.resident(self.workload.world_size)


FORWARD_PHASES = {"actor": "log_prob", "ref": "ref", "critic": "values"}


def _generation_phase(step: _Step, batch: int | None) -> dict[str, float]:
    """Training rollout or validation: vLLM holds its own weights and KV cache inside its share; the
    built-in engine generates with the actor's weights gathered whole (cast under autocast)."""
    actor, world_size = step.roles["actor"], step.workload.world_size
    terms = step.idle("actor")
    # offloaded shards stay on the host (the built-in engine uses the gathered copy it counts)
    terms.update(actor.resident(world_size))
    if step.rollout.name == "vllm":
        terms["rollout.engine share"] = step.rollout.gpu_memory_utilization * step.device_memory_gb * GiB
    else:
        terms.update(_builtin_rollout(step.model, actor, step.workload, step.rollout, batch))
    return terms


def _forward_phase(step: _Step, name: str) -> dict[str, float]:
    """A no-grad forward over the rollout batch: old log-probs (actor), reference log-probs, values. Its
    peak is the largest of three moments, as nothing is kept from one to the next: inside a decoder layer
    (two layer units gathered, one layer's transients), at the output projection (only the root unit
    gathered, or the output projection cast for its matmul, the final hidden states and the new logits),
    and in the chunked log-prob pass over the logits (the root unit still gathered)."""
    role, spec = step.roles[name], step.spec(name)
    terms = step.idle(name)
    terms.update(step.on_device(role))
    c = role.plan.compute_dtype
    tokens, resp, rows = _tokens(role.plan, step.workload, name, forward=True)
    layer = {f"{name}.compute_copy": _compute_copy(spec, role, c, compiled=step.compiled_layers)}
    layer.update(_activations(spec, role.plan, tokens, step.workload.seq_len, train=False))
    tokens, resp = _head_rows(role.plan, tokens, resp)
    stream = residual_dtype(role.plan) if role.trainable else read_dtype(role.plan, False)
    hidden = {"hidden states": tokens * spec.hidden_size * 2 * max(BYTES[c], BYTES[stream])}
    if name == "critic":
        head = {f"{name}.compute_copy": _compute_copy(spec, role, c, compiled=step.compiled_layers, layers=0),
                **hidden, "values": tokens * spec.hidden_size * 4}
        terms.update(max((layer, head), key=lambda t: sum(t.values())))
        return terms
    logits = resp * spec.vocab_size * BYTES[c]
    head = {f"{name}.compute_copy": _compute_copy(spec, role, c, compiled=step.compiled_layers, layers=0),
            **hidden, "logits": logits}
    # after a forward without gradients FSDP2 has resharded the root unit too (an allocator trace of an offloaded
    # 3B actor and reference: root freed before the pass); a plan gathering the whole model per call keeps it
    kept = _gathered_units(spec, role, c, False, 0) if role.plan.gather_for_forward else 0.0
    log_prob = {f"{name}.compute_copy": kept, "logits": logits,
                "log-prob scratch": _logprob_scratch(spec, resp, c, backward=False, fused=step.compiled_layers)}
    pixels = _pixel_values(step, name, rows)   # a VL micro-batch's pixels stay on the device through the call
    for moment in (layer, head, log_prob):
        moment.update(pixels)
    # a VL model's tower runs first, over the micro-batch's images; only its merged output outlives it
    tower = {f"{name}.compute_copy": layer[f"{name}.compute_copy"],
             **_vision_terms(step, name, rows, train=False)}
    terms.update(max((layer, head, log_prob, tower), key=lambda t: sum(t.values())))
    return terms


def _pixel_values(step: _Step, name: str, rows: int) -> dict[str, float]:
    """The float32 pixel values of a VL micro-batch of `rows` sequences (none for a text-only model)."""
    spec, role = step.spec(name), step.roles[name]
    if spec.vision is None or not step.workload.image_tokens or not rows:
        return {}
    plan = role.plan
    return {"pixel values": vision_bytes(spec, plan.compute_dtype, read_dtype(plan, role.trainable),
                                         plan.attn_implementation, rows, step.workload.image_tokens, "frozen")}


def _vision_terms(step: _Step, name: str, rows: int, train: bool, running: bool = False) -> dict[str, float]:
    """`vision_term` of role `name` as a phase term (none for a text-only model)."""
    role = step.roles[name]
    total = vision_term(step.spec(name), step.workload, role.plan, role.trainable, rows, train, running)
    return {"vision tower": total} if total else {}


def vision_term(model: ModelSpec, workload: Workload, plan: RolePlan, trainable: bool, rows: int, train: bool,
                running: bool = False) -> float:
    """A VL model's vision tower over `rows` sequences of a micro-batch (0 for a text-only model): without
    gradients its forward's transients; in an update what it keeps for backward (all of it, checkpointed
    block inputs, or only the pixels of a frozen tower) from its forward until its own backward, the last
    of the pass, plus, while it runs (`running`), its forward's transients."""
    if model.vision is None or not workload.image_tokens or not rows:
        return 0.0
    attn, tokens, c = plan.attn_implementation, workload.image_tokens, plan.compute_dtype
    if not train:
        return vision_bytes(model, c, read_dtype(plan, trainable), attn, rows, tokens, "forward")
    weights = residual_dtype(plan)
    kept = "frozen" if plan.vision_frozen else "checkpointed" if plan.gradient_checkpointing else "saved"
    total = vision_bytes(model, c, weights, attn, rows, tokens, kept)
    if running:   # the forward's transients, its pixels already counted
        total += vision_bytes(model, c, weights, attn, rows, tokens, "forward") \
            - vision_bytes(model, c, weights, attn, rows, tokens, "frozen")
    return total


def micro_batch_rows(plan: RolePlan, workload: Workload, role: str, forward: bool) -> int:
    """Sequences in the largest micro-batch of `role` (`_tokens`)."""
    return _tokens(plan, workload, role, forward)[2]


def _update_phase(step: _Step, name: str) -> dict[str, float]:
    """Forward + backward + optimizer step of a trained role, at the largest of its candidate peaks:
    the end of a forward, the log-prob backward (`_head_stages`), a
    layer's backward, the end of backward, the optimizer step. Gradients exist from the first backward
    of a mini-batch to its optimizer step (which frees them): the first micro-batch (the largest:
    token-budgeted splits take the longest rows first) reaches the end of its forward without them,
    the later ones (at most the rows left) with them."""
    role, spec, world_size = step.roles[name], step.spec(name), step.workload.world_size
    terms = step.idle(name)
    terms.update(step.on_device(role))
    tokens, resp, rows = _tokens(role.plan, step.workload, name, forward=False)
    grads = 0.0 if role.plan.param_offload else role.grads(world_size)   # under param offload reduced onto the host
    later = min(rows, step.workload.sequences_seen(name, forward=False) - rows)
    heads = _head_stages(step, name, rows, 0.0) + (_head_stages(step, name, later, grads) if later > 0 else [])
    # mid-backward: the checkpointed inputs, the layer being recomputed and its gradients, and that unit's
    # parameter gradients, unsharded and in the flat copy FSDP2 reduces from, next to the gathered units
    # (all of them when the plan keeps them gathered for backward; what bounds a model of few wide layers
    # and a small vocabulary). An unwrapped model's gradients accumulate in place: the grads term holds them.
    per_layer = (role.trained if role.lora else role.params - _root_unit(spec, role)) / spec.num_layers
    wrapped, ckpt = role.plan.fsdp, role.plan.gradient_checkpointing
    layer_bwd = {f"{name}.grads": grads,
                 f"{name}.compute_copy": _compute_copy(spec, role, role.plan.compute_dtype, train=True,
                                                       checkpointed=ckpt and name != "critic"),
                 **_activations(spec, role.plan, tokens, step.workload.seq_len, train=True, compiled=step.compiled_layers),
                 "layer grads (backward)": 2 * per_layer * BYTES[role.plan.param_dtype] if wrapped else 0.0,
                 **_vision_terms(step, name, rows, train=True)}
    # a VL model's tower forward opens the micro-batch: what it keeps so far and one block's transients
    tower = {f"{name}.grads": grads, f"{name}.compute_copy": layer_bwd[f"{name}.compute_copy"],
             **_vision_terms(step, name, rows, train=True, running=True)}
    # the root unit stays gathered until its gradients are reduced, at the very end of backward
    root_dtype = role.plan.compute_dtype if role.lora else gather_dtype(role.plan)
    bwd_end = {f"{name}.grads": grads,
               f"{name}.compute_copy": _root_unit(spec, role) * BYTES[root_dtype] if wrapped else 0.0,
               "vocab grads (end of backward)": _vocab_grad_bytes(spec, role, accumulates=later > 0),
               # the embedding's gradient may be made before the tower's backward frees what it kept
               **_vision_terms(step, name, rows, train=True)}
    # bitsandbytes' 8-bit step updates in place; under param offload the step runs on the host
    in_place = role.plan.optimizer_8bit or (role.plan.fused_optimizer and not (role.plan.fsdp and
                                                                               role.plan.optimizer_offload))
    scratch = 0.0 if in_place or role.plan.param_offload else ADAM_STEP_SCRATCH * role.trained * 4 / world_size
    optimizer_stage = {f"{name}.grads": grads, "optimizer step": scratch}
    if role.plan.optimizer_offload and not role.plan.param_offload:
        optimizer_stage[f"{name}.optimizer"] = role.optimizer(world_size)
    terms.update(max((*heads, layer_bwd, tower, bwd_end, optimizer_stage), key=lambda t: sum(t.values())))
    return terms


def _head_stages(step: _Step, name: str, rows: int, grads: float) -> list[dict[str, float]]:
    """Candidate peaks around the output of a training forward over `rows` full-length sequences (`grads`:
    bytes of gradients already accumulated by earlier micro-batches of the mini-batch), where no decoder
    layer is gathered (only the root unit) and, under checkpointing, only the layer inputs are saved:
    (1) the end of forward: the logits and the log-prob pass's forward scratch, autocast's cached casts
    still alive; (2) the log-prob's backward: the saved logits, their gradient and its chunk scratch,
    autocast's cache gone (what stays cast is what backward saved), and the output projection's weight
    gradient. A critic: its values head."""
    role, spec = step.roles[name], step.spec(name)
    c, ckpt = role.plan.compute_dtype, role.plan.gradient_checkpointing
    tokens, resp = rows * step.workload.seq_len, rows * step.workload.response_length
    base = {f"{name}.grads": grads, **_vision_terms(step, name, rows, train=True)}
    if name == "critic":
        base[f"{name}.compute_copy"] = _compute_copy(spec, role, c, train=True)
        base.update(_activations(spec, role.plan, tokens, step.workload.seq_len, train=True, compiled=step.compiled_layers))
        tokens, _ = _head_rows(role.plan, tokens, resp)
        return [{**base, "values": tokens * spec.hidden_size * 4 * 2}]
    # without checkpointing every layer's saved activations, and FSDP2's units around them, as in a layer's backward
    base.update(_activations(spec, role.plan, tokens, step.workload.seq_len, train=True, compiled=step.compiled_layers,
                             recomputing=not ckpt))
    layers = 0 if ckpt else 2
    _, resp = _head_rows(role.plan, tokens, resp)
    logits = resp * spec.vocab_size * BYTES[c]
    copy = _compute_copy(spec, role, c, train=True, layers=layers)
    saved = _compute_copy(spec, role, c, train=True, layers=layers, checkpointed=ckpt)
    # the output projection's weight gradient (frozen under LoRA) exists from the log-prob backward on
    out_grad = {} if role.lora else {"output projection grad": spec.vocab_size * spec.hidden_size * BYTES[c]}
    return [{**base, f"{name}.compute_copy": copy, "logits": logits,
             "log-prob scratch": _logprob_scratch(spec, resp, c, backward=False, fused=step.compiled_layers)},
            {**base, f"{name}.compute_copy": saved, "logits": 2 * logits, **out_grad,
             "log-prob scratch": _logprob_scratch(spec, resp, c, backward=True, fused=step.compiled_layers)}]


# ----------------------------------------------------------------------------- reward model

REWARD_MODEL = "reward_model"


def reward_model_params(spec: ModelSpec) -> int:
    """A one-label sequence classifier: the trunk, its vocabulary head replaced by a bias-free 1-wide score."""
    return spec.num_params - spec.lm_head_params + spec.hidden_size


@dataclass(frozen=True)
class _RewardModel:
    """The reward model's role: a whole frozen copy per rank (never wrapped), scoring `rows` sequences of
    up to `seq_len` tokens per forward."""

    spec: ModelSpec
    plan: RolePlan
    rows: int
    seq_len: int

    def weights(self) -> float:
        return reward_model_params(self.spec) * BYTES[self.plan.param_dtype]

    def resident(self) -> dict[str, float]:
        """Between reward passes: nothing where its weights wait in host memory."""
        return {f"{REWARD_MODEL}.weights": 0.0 if self.plan.param_offload else self.weights()}


def reward_model_forward(spec: ModelSpec, plan: RolePlan, rows: int, seq_len: int) -> dict[str, float]:
    """Bytes of one reward-model forward over `rows` padded sequences of `seq_len` tokens, beside its weights:
    in the compute dtype, or, where the plan guards float16, the larger of that and the guard's one float32
    pass over the first micro-batch (`RewardModelWorker._check_numerics`)."""
    passes = [_reward_model_pass(spec, plan.compute_dtype, plan.param_dtype, plan.attn_implementation, rows, seq_len)]
    if plan.numerics_guard:
        passes.append(_reward_model_pass(spec, "float32", plan.param_dtype, plan.attn_implementation, rows, seq_len))
    return max(passes, key=lambda t: sum(t.values()))


def _reward_model_pass(spec: ModelSpec, c: str, stored: str, attn: str, rows: int, seq_len: int) -> dict[str, float]:
    """One forward computed in `c` over weights stored in `stored`, at the larger of two moments (nothing is
    kept from one layer to the next, no vocabulary logits): inside a decoder layer (the input embeddings the
    worker passes in, one layer's transients, and autocast's cast of the largest linear weight when stored
    in another dtype) and at the head (the embeddings, the final hidden states and their norm, the 1-wide
    float32 scores). The residual stream is as wide as the wider of the two dtypes (autocast's outputs are
    added to it)."""
    residual = stored if BYTES[stored] > BYTES[c] else c
    tokens = rows * seq_len
    embeds = {"inputs_embeds": tokens * spec.hidden_size * BYTES[stored]}
    cast = max(i * o for i, o in spec.linear_shapes()) * BYTES[c] if stored != c else 0.0
    layer = {**embeds, "activations (1 layer)": tokens * layer_forward_bytes(spec, c, residual, attn, seq_len),
             f"{REWARD_MODEL}.compute_copy": cast}
    head = {**embeds, "hidden states": tokens * spec.hidden_size * 2 * BYTES[residual], "scores": tokens * 4}
    return max((layer, head), key=lambda t: sum(t.values()))


def _reward_model_phase(step: _Step) -> dict[str, float]:
    """The reward pass: every role's resident state, the reward model's weights (brought over for the pass
    when they wait in host memory) and one forward."""
    rm = step.reward_model
    terms = step.idle(REWARD_MODEL)
    terms[f"{REWARD_MODEL}.weights"] = rm.weights()
    terms.update(reward_model_forward(rm.spec, rm.plan, rm.rows, rm.seq_len))
    return terms


def _role(name: str, plan: RolePlan, spec: ModelSpec, params: int, trainable: bool) -> _Role:
    adapters = spec.lora_params(plan.lora_rank) if plan.lora_rank else 0
    if adapters and name == "critic":
        adapters += spec.hidden_size + 1          # the value head trains whole
    quantized = spec.decoder_linear_params if plan.base_quantization == "nf4" else 0
    return _Role(name, plan, params, trainable, adapters, quantized)


def _roles(model: ModelSpec, critic_model: ModelSpec, actor: RolePlan, critic: RolePlan | None,
           ref: RolePlan | None) -> dict[str, _Role]:
    roles = {"actor": _role("actor", actor, model, model.num_params, True)}
    if critic is not None:
        roles["critic"] = _role("critic", critic, critic_model, critic_model.critic_params, True)
    if ref is not None:
        roles["ref"] = _role("ref", ref, model, model.num_params, False)
    return roles


def beside_copies(step: _Step) -> float:
    """Bytes of the input copies `compile_warmup=background` keeps for its side thread (verl/utils/compile_beside.py):
    one call's inputs per kind of call of each compiled function, all held from the first step until the build
    uses them. Per function, its largest inputs: the decode step, one layer's keys and values at the engine's
    chunk and the layer's weights (and their fused copy); the sampler, a chunk's logits and float32 draws; the
    decoder layers, a layer's weights and one micro-batch's hidden states and rotary tables per pass (log-probs,
    reference, update); the log-prob kernels, five chunks of logits (log-sum-exp with and without the update,
    entropy, the gradient's input and output)."""
    spec, work, rollout, actor = step.model, step.workload, step.rollout, step.roles["actor"]
    c = BYTES[actor.plan.compute_dtype]
    layer = sum(i * o for i, o in spec.linear_shapes())
    total = 0.0
    if rollout.compile_backend and rollout.name != "vllm" and work.generates:
        r = BYTES[rollout.dtype]
        rows = min(work.rollout_batch_per_gpu, rollout.micro_batch_size or work.rollout_batch_per_gpu)
        keys_values = 2 * rows * spec.num_kv_heads * spec.head_dim * (work.seq_len + 1) * r
        total += keys_values + layer * r * (2 if rollout.fused_projections else 1) + rows * spec.vocab_size * (r + 4)
    rows = micro_batch_rows(actor.plan, work, "actor", forward=True)
    passes = 2 + ("ref" in step.roles)
    per_token = (spec.hidden_size + 2 * spec.head_dim) * c   # hidden states, rotary cos and sin
    total += passes * (layer * BYTES[gather_dtype(actor.plan)] + rows * work.seq_len * per_token)
    chunk = min(rows * (work.response_length + 1), LOGPROB_CHUNK_ROWS)   # a padded row's outputs: response + 1
    return total + 5 * chunk * spec.vocab_size * c


def estimate_memory(model: ModelSpec, workload: Workload, actor: RolePlan, rollout: RolloutPlan,
                    critic: RolePlan | None = None, ref: RolePlan | None = None, *,
                    device_memory_gb: float, backend: str = "cuda", fragmentation: float = 0.05,
                    critic_model: ModelSpec | None = None, compiled_layers: bool = False,
                    ref_in_actor: bool = False, reward_model: RolePlan | None = None,
                    reward_model_spec: ModelSpec | None = None, reward_seq_len: int | None = None,
                    beside: bool = False) -> MemoryEstimate:
    """Peak allocated memory of each phase of one PPO step on one device (GiB), the generation phases
    only where `workload.generates`; `compiled_layers`:
    the plan's torch_compile compiles the decoder layers (they keep less for backward); `ref_in_actor`:
    the reference log-probs are a forward of the LoRA actor with its adapters disabled; `reward_model`
    (with its model's spec): a `reward_model` phase scoring sequences of `reward_seq_len` tokens (default:
    prompt + response), its weights resident in the other phases unless offloaded; `beside`: the first steps run
    eagerly with the side thread's input copies held in every phase (`beside_copies`)."""
    cmodel = critic_model or model
    rm = None
    if reward_model is not None and reward_model_spec is not None:
        rows = min(reward_model.forward_micro_batch_size_per_gpu or workload.rollout_batch_per_gpu,
                   workload.rollout_batch_per_gpu)
        rm = _RewardModel(reward_model_spec, reward_model, rows, reward_seq_len or workload.seq_len)
    step = _Step(model, cmodel, workload, _roles(model, cmodel, actor, critic, ref), rollout, device_memory_gb,
                 compiled_layers, rm)
    phases = {"rollout": _generation_phase(step, workload.rollout_batch_per_gpu),
              "validation": _generation_phase(step, workload.val_batch_per_gpu)} if workload.generates else {}
    phases.update({label: _forward_phase(step, name) for name, label in FORWARD_PHASES.items() if name in step.roles})
    if ref_in_actor:
        phases["ref"] = _forward_phase(step, "actor")
    phases.update({f"{name}_update": _update_phase(step, name) for name in ("actor", "critic") if name in step.roles})
    if rm is not None:
        phases[REWARD_MODEL] = _reward_model_phase(step)
    if beside:
        copies = beside_copies(step)
        for terms in phases.values():
            terms["compile.beside copies"] = copies
    in_gib = {label: PhaseMemory(label, {k: v / GiB for k, v in terms.items()}) for label, terms in phases.items()}
    context = 0.0 if backend == "cpu" else CUDA_CONTEXT_GB
    return MemoryEstimate(phases=in_gib, context_gb=context, fragmentation=fragmentation)
