"""Static-cache decoding for Llama-family HF causal LMs (Llama, Mistral, Qwen2/2.5, Qwen3).

HF's forward rebuilds its attention mask and grows its cache on every call, which for a small model
costs more than the arithmetic. This decoder allocates the whole KV cache once, runs the prompt in
one pass (prefill), then runs one fixed-shape step per token; fixed shapes and fixed buffers are what
lets the engine record that step as a CUDA graph and replay it. It calls the model's own submodules
(embedding, norms, projections, MLP, head, rotary embedding), so it computes with the actor's weights
in place; only the attention over the cache is written here.

Layout: every row's prompt fills cache slots [0, P) (left padding included, masked out as keys),
and the token generated at step s goes to slot P + s, the same slot in every row. Step s therefore
needs only slots [0, P + s]: it attends over a window of the first W slots, W the smallest multiple
of WINDOW_BUCKET that covers them, rather than the whole cache (most of which, early on, is unwritten),
unless the whole cache is small beside the weights (WHOLE_CACHE_SHARE): then one window covers it.

Vision-language models whose text model is a Qwen2 decoder (Qwen2-VL, Qwen2.5-VL) are decoded here
too, after a prefill through the model's own forward: the image features and the multimodal (mrope)
positions enter there, and `load_prefix` copies the keys and values it cached (already rotated) into
slots [0, P). Every generated token is text, whose three mrope positions are equal, and mrope with
equal positions is the ordinary 1-D rotary of the text model's inverse frequencies: the decode step
is the text model's, at the mrope position following the prompt's last.

A decode step for a small model is ~50 tiny kernels per layer (norms, rotary, casts, the attention's
softmax), each too short to hide its launch even inside a CUDA graph. With `compile_backend` the
per-layer step is a `torch.compile`d function (module-level, layer passed in, so one compiled graph
serves every layer) and its elementwise work is fused; the prefill stays eager (one pass per chunk).
Each window size is its own shape, so with graphs each is recorded once, when decoding first reaches it.

Rows that have finished can leave (`keep_rows`): the rows still wanted move to the front of every buffer
and the steps run over that prefix only, so a finished row stops costing work. The buffers stay where
they are (a prefix view is the compiled step's input, and each (rows, window) pair its own graph), so
the next prefill takes every row back without allocating anything.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from verl.utils.compile_beside import building_beside


__all__ = ["StaticDecoder", "compiled_decode_step", "fuse_projections", "static_decoding_unsupported"]

_FAMILIES = ("llama", "mistral", "qwen2", "qwen3")
# vision-language models whose text model is a Qwen2 decoder with mrope over (temporal, height, width)
_VL_FAMILIES = ("qwen2_vl", "qwen2_5_vl")
# rotary types whose cos/sin for a position do not depend on the length of the call
_ROPE_TYPES = ("default", "linear", "llama3")
# Decode windows grow in steps of this many cache slots: at most 63 unwritten slots read per step
# (out of 1,024 at the GRPO shape), and a recorded graph per 64 tokens, which costs capture time only
# (all windows' graphs share one memory pool and one logits buffer).
WINDOW_BUCKET = 64
# Where reading the whole cache costs a step less than this share of reading the weights (one row of a
# 0.5B model: 8 MB of cache against 2 GB), one window covers the cache: one graph to record per decoder
# (a decoder per generate call) instead of one per 64 tokens, at no measurable cost per step.
WHOLE_CACHE_SHARE = 0.05


def _parts(inner: nn.Module):
    """The text model (embed_tokens, layers, norm, rotary_emb) and the LM head; a VL model's text model
    is `model.language_model`."""
    base = getattr(inner, "model", None)
    base = getattr(base, "language_model", base)
    head = inner.get_output_embeddings() if hasattr(inner, "get_output_embeddings") else None
    return base, head


def static_decoding_unsupported(inner: nn.Module) -> str | None:
    """Why this model cannot use the static decoder, or None when it can."""
    cfg = getattr(inner, "config", None)
    family = getattr(cfg, "model_type", None)
    if getattr(cfg, "vision_config", None) is not None:
        if family not in _VL_FAMILIES:
            return (f"vision-language model type {family!r} is not one of {_VL_FAMILIES} (a Qwen2 text model "
                    "whose generated tokens take equal mrope positions)")
        cfg = cfg.get_text_config()
    elif family not in _FAMILIES:
        return f"model type {family!r} is not one of {_FAMILIES}"
    base, head = _parts(inner)
    needed = ("embed_tokens", "layers", "norm", "rotary_emb")
    if base is None or head is None or any(not hasattr(base, n) for n in needed):
        return "the model does not have the usual embed_tokens/layers/norm/rotary_emb/lm_head layout"
    layer_types = getattr(cfg, "layer_types", None)
    if layer_types is not None:
        if any(t != "full_attention" for t in layer_types):
            return "sliding-window attention layers"
    elif getattr(cfg, "use_sliding_window", True) and getattr(cfg, "sliding_window", None) is not None:
        return "sliding-window attention"
    rope = getattr(base.rotary_emb, "rope_type", "default")
    if rope not in _ROPE_TYPES:
        return f"rotary type {rope!r} (its angles depend on the sequence length)"
    return None


def _rotary_table(rotary: nn.Module, positions: int, dtype, device, multimodal: bool):
    """cos/sin (positions, head_dim) from the model's own rotary module, so scaled variants match.

    A multimodal (mrope) module is given equal positions on its three axes, the positions of text
    tokens: it returns (batch, seq, dim) with the sections already chosen (transformers 5) or
    (3, batch, seq, dim), one table per axis, all equal here (transformers 4.x)."""
    ids = torch.arange(positions, device=device)[None]
    if multimodal:
        ids = ids.expand(3, 1, positions)
    cos, sin = rotary(torch.zeros(1, dtype=dtype, device=device), ids)
    if cos.dim() == 4:
        cos, sin = cos[0], sin[0]
    return cos[0].to(dtype), sin[0].to(dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding: pairs (i, i + D/2) rotated by the position's angle."""
    half = x.shape[-1] // 2
    turned = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + turned * sin


class StaticDecoder:
    """A preallocated KV cache for `batch` rows of up to `max_len` tokens, and the two passes over it.

    `dtype` is the dtype activations come out in (the autocast dtype, else the weights'); the cache
    is kept in it. `positions` bounds the position ids used (prompt positions plus new tokens).
    With `graphs`, the first decode step over each attention window (see `window`) and row count (see
    `keep_rows`) is recorded as a CUDA graph and every later step over that window and rows replays it.
    With `compile_backend` (a torch.compile backend: a name such as "inductor", or a callable), the
    per-layer decode step is compiled with it (the first call compiles, for any shape and window). `step`,
    where given, stands for `decode_layer` (a BesideCompiler's switch between it and its compiled form).
    With `fused`, the decode step reads each layer's q/k/v and gate/up from copies side by side
    (`fuse_projections`).
    """

    def __init__(self, inner: nn.Module, batch: int, max_len: int, positions: int, dtype: torch.dtype,
                 device: torch.device, graphs: bool = False, compile_backend=None, step=None, fused: bool = False):
        base, self.head = _parts(inner)
        self.embed, self.layers, self.norm = base.embed_tokens, list(base.layers), base.norm
        cfg = inner.config.get_text_config()
        attn = self.layers[0].self_attn
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = attn.head_dim
        self.scaling = getattr(attn, "scaling", self.head_dim ** -0.5)
        self.max_len = max_len
        cache_bytes = 2 * len(self.layers) * batch * self.kv_heads * max_len * self.head_dim * dtype.itemsize
        weight_bytes = sum(p.numel() * p.element_size() for p in inner.parameters())
        self.bucket = max_len if cache_bytes <= WHOLE_CACHE_SHARE * weight_bytes else WINDOW_BUCKET
        # one slot more than any window reads: the window the step slices is then never the whole
        # (contiguous) cache, and the compiled step, whose matmuls guard on contiguity, runs one graph
        shape = (batch, self.kv_heads, max_len + 1, self.head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in self.layers]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in self.layers]
        self.cos, self.sin = _rotary_table(base.rotary_emb, positions, dtype, device,
                                           multimodal=getattr(inner.config, "vision_config", None) is not None)
        self.key_valid = torch.ones(batch, max_len, dtype=torch.bool, device=device)
        self.slots = torch.arange(max_len, device=device)
        # the decode step's inputs: written before each step, read by the (recorded) step
        self.token = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.position = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.slot = torch.zeros(1, dtype=torch.long, device=device)
        self.batch = batch
        self.rows = batch  # the leading rows of every buffer the steps run over (see keep_rows)
        self.filled = 0    # cache slots written so far: [0, filled)
        self._prefixes: dict[int, tuple[list, list]] = {}  # rows -> per layer (keys, values) views of them
        self.graphs = graphs
        self._graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}  # (rows, window) -> its recorded step
        self._pool = None  # one memory pool for every window's graph: they replay one at a time
        self._graph_logits = None  # every graph writes its logits into its rows of this (batch x vocab)
        self._compiled = bool(compile_backend) or step is not None
        # per layer (q/k/v weight, its bias or None, gate/up weight) side by side, in the activations' dtype, or None
        self.fused = [fuse_projections(layer, dtype) for layer in self.layers] if fused else [None] * len(self.layers)
        for t in self.keys + self.values:
            _static_dims(t, 1, 3)   # kv heads and head size; rows and cache length vary between decoders
        for t in (t for f in self.fused if f is not None for t in f if t is not None):
            _static_dims(t, *range(t.dim()))
        self._layer_step = step or (_compiled_layer_step(compile_backend) if compile_backend else decode_layer)

    # ------------------------------------------------------------------ passes

    def prefill(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Run the (left-padded) prompts, fill cache slots [0, P), return the last position's logits (in the
        head's output dtype: the sampler computes in float32 from them)."""
        length = ids.shape[1]
        self.rows, self.filled = self.batch, length
        self.key_valid[:, :length] = mask.bool()
        self.key_valid[:, length:] = True  # later slots are gated by the step's slot instead
        causal = torch.ones(length, length, dtype=torch.bool, device=ids.device).tril()
        # a padding query attends to itself only, so its (unused) output stays finite
        allowed = (causal & self.key_valid[:, None, :length]) | torch.eye(length, dtype=torch.bool,
                                                                          device=ids.device)
        cos, sin = F.embedding(positions, self.cos), F.embedding(positions, self.sin)
        return self._prefill(ids, cos, sin, allowed[:, None])

    def load_prefix(self, keys_values, mask: torch.Tensor) -> None:
        """Take a prefill done elsewhere (a VL model's own forward): `keys_values` holds each layer's
        (keys, values), rotated, (batch, kv_heads, P, head_dim), for the left-padded prompts that `mask`
        (batch, P) marks; they fill cache slots [0, P) as `prefill` would have."""
        length = mask.shape[1]
        self.rows, self.filled = self.batch, length
        self.key_valid[:, :length] = mask.bool()
        self.key_valid[:, length:] = True  # later slots are gated by the step's slot instead
        for (k, v), keys, values in zip(keys_values, self.keys, self.values, strict=True):
            keys[:, :, :length] = k
            values[:, :, :length] = v

    def decode(self, token: torch.Tensor, position: torch.Tensor, slot: int) -> torch.Tensor:
        """One token per row at `position`, written to cache `slot`; returns logits (rows, vocab) in the head's
        output dtype (no float32 copy of them here: the sampler upcasts as it reads).

        With graphs, the returned tensor is the graphs' output buffer: read it before the next step."""
        rows = self.rows
        self.token[:rows].copy_(token.view(-1, 1))
        self.position[:rows].copy_(position.view(-1, 1))
        self.slot.fill_(slot)
        self.filled = slot + 1
        window = self.window(slot)
        if not self.graphs:
            return self._step(window)
        if (rows, window) not in self._graphs:
            if building_beside():   # record once the side thread is done (see building_beside)
                return self._step(window)
            if not self._record(window):
                return self._graph_logits[:rows]   # the warm-up computed this step and started a build
        self._graphs[rows, window].replay()
        return self._graph_logits[:rows]

    def keep_rows(self, index: torch.Tensor) -> None:
        """Go on with only the current rows `index` (ascending), in that order: their cache and padding
        mask move to the front of the buffers, and later steps run over those rows alone. Costs one copy of
        the kept rows' written cache slots, a layer at a time; the next prefill restores every row."""
        count, written = index.numel(), slice(0, self.filled)
        for buffer in (*self.keys, *self.values):
            buffer[:count, :, written] = buffer[:, :, written].index_select(0, index)
        self.key_valid[:count] = self.key_valid.index_select(0, index)
        self.rows = count

    def window(self, slot: int) -> int:
        """How many leading cache slots the step writing `slot` attends over: slots [0, slot] rounded
        up to a multiple of the bucket, so one shape (one graph) serves a run of steps."""
        return min(self.max_len, -(-(slot + 1) // self.bucket) * self.bucket)

    # ------------------------------------------------------------------ internals

    def _step(self, window: int, out: torch.Tensor | None = None) -> torch.Tensor:
        """The decode step of the current rows over cache slots [0, window); its logits, written into `out`
        if given."""
        rows = self.rows
        position = self.position[:rows]
        cos, sin = F.embedding(position, self.cos), F.embedding(position, self.sin)
        cos, sin = cos[:, None], sin[:, None]
        # padding and unwritten slots
        hidden = ~(self.key_valid[:rows, :window] & (self.slots[:window] <= self.slot))[:, None, None, :]
        if self._compiled:  # the window is a symbol from the first compile on, not one graph per window
            torch._dynamo.mark_dynamic(hidden, 3)
        x = self.embed(self.token[:rows])
        if self._compiled:
            _static_dims(x, 1, 2)
        all_keys, all_values = self._prefix(rows)
        for layer, keys, values, fused in zip(self.layers, all_keys, all_values, self.fused):
            x = self._layer_step(layer, x, cos, sin, hidden, keys, values, self.slot, fused)
        logits = self.head(self.norm(x[:, -1]))
        return logits if out is None else out.copy_(logits)

    def _prefix(self, rows: int) -> tuple[list, list]:
        """Every layer's keys and values of the first `rows` rows: the whole buffers, or views of their
        leading rows, made once per row count and marked as the buffers are (a contiguous prefix, which
        the compiled step takes as it takes a whole cache, without compiling again)."""
        if rows == self.batch:
            return self.keys, self.values
        if rows not in self._prefixes:
            views = ([k[:rows] for k in self.keys], [v[:rows] for v in self.values])
            for t in views[0] + views[1]:
                _static_dims(t, 1, 3)
            self._prefixes[rows] = views
        return self._prefixes[rows]

    def _record(self, window: int) -> bool:
        """Capture `_step` of the current rows over `window` as a CUDA graph. Warm-up runs on a side stream
        first, as capture requires; it computes the current step for real (its logits left in the logits
        buffer), and the replay that follows rewrites the same slot. Every graph shares one memory pool (only
        one replays at a time, and nothing a graph allocates outlives its replay) and writes its rows of one
        logits buffer (read before the next step). Not recorded (False) when the warm-up's first call of a
        compiled step started building it beside (verl/utils/compile_beside.py).

        The warm-up is skipped for a window this process has already run with the same shapes and step
        code (`_warmed`), except for a decoder's first recording, which makes its logits buffer: every
        kernel such a capture launches was loaded and every compile done by the earlier run, and each
        warm-up costs as much host time as the capture (a generate call records a window per `WINDOW_BUCKET` tokens)."""
        side = _warmup_stream(self.keys[0].device)
        side.wait_stream(torch.cuda.current_stream())
        shapes = self._shapes(window)
        rows = self.rows
        try:
            if self._graph_logits is None or shapes not in _warmed:
                with torch.cuda.stream(side):
                    logits = self._step(window)
                torch.cuda.current_stream().wait_stream(side)
                if self._graph_logits is None:
                    self._graph_logits = logits.new_empty((self.batch, logits.shape[-1]))
                    self._pool = torch.cuda.graph_pool_handle()
                self._graph_logits[:rows].copy_(logits)
                del logits
                if building_beside():
                    return False
            graph = torch.cuda.CUDAGraph()
            # captured on the warm-up stream directly: `torch.cuda.graph` would first synchronize the device
            # and empty torch's device and page-locked caches, at every window (a graph per 64 tokens), so
            # the device idled through each capture and the next allocations went back to the driver
            with torch.cuda.stream(side):
                graph.capture_begin(pool=self._pool)
                try:
                    self._step(window, self._graph_logits[:rows])
                finally:
                    graph.capture_end()
        except RuntimeError as e:
            raise RuntimeError(f"compiling or capturing the rollout decode step as a CUDA graph failed ({e}); set "
                               "actor_rollout_ref.rollout.enforce_eager=True to decode without graphs or compilation"
                               ) from e
        self._graphs[rows, window] = graph
        _warmed.add(shapes)
        return True

    def _shapes(self, window: int) -> tuple:
        """What decides the kernels a step over `window` launches (not the buffers' addresses): the
        shapes and dtype (the cache's length too: it sets the strides the window's matmuls read with), the
        layout of the projections, and the step code now in force (a compile switch's eager or compiled form)."""
        step = self._layer_step
        if hasattr(step, "owner"):   # a BesideCompiler's switch
            step = step.compiled if step.owner.compiled else step.eager
        return (self.keys[0].device, tuple(self.keys[0].shape), self.rows, window, self.keys[0].dtype,
                self.fused[0] is not None, self.heads, id(step))

    def _prefill(self, ids, cos, sin, mask) -> torch.Tensor:
        x = self.embed(ids)
        for i, layer in enumerate(self.layers):
            x = x + self._attention(i, layer.self_attn, layer.input_layernorm(x), cos, sin, mask)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        return self.head(self.norm(x[:, -1]))

    def _attention(self, i, attn, h, cos, sin, mask) -> torch.Tensor:
        """The prefill's attention: fill cache slots [0, P) and attend under the prompt mask."""
        batch, length, _ = h.shape
        q, k, v = _project(attn, h, cos[:, None], sin[:, None], self.head_dim, self.keys[i].dtype)
        self.keys[i][:, :, :length] = k
        self.values[i][:, :, :length] = v
        groups = self.heads // self.kv_heads
        out = F.scaled_dot_product_attention(q, k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1),
                                             attn_mask=mask, scale=self.scaling)
        return attn.o_proj(out.transpose(1, 2).reshape(batch, length, -1))


def _static_dims(tensor: torch.Tensor, *dims: int) -> None:
    """Model constants (hidden size, heads, head size, weight shapes) compile as constants into the decode step,
    whose shapes are otherwise symbolic: each symbol costs symbolic reasoning at every op that reads it
    (docs/performance.md, "Why the code does it this way"). A mark read only when dynamo compiles."""
    for dim in dims:
        torch._dynamo.mark_static(tensor, dim)


def _project(attn, h, cos, sin, head_dim, cache_dtype, qkv=None, kv_width=None):
    """Queries, keys and values (batch, heads, length, head_dim), rotated; keys/values in the cache's dtype.
    `qkv`: (weight, bias) of the three projections side by side (`fuse_projections`), one matmul for all, whose
    last `2 * kv_width` output features are the keys' and values'."""
    batch, length, _ = h.shape
    if qkv is None:
        q, k, v = attn.q_proj(h), attn.k_proj(h), attn.v_proj(h)
    else:
        q_width = qkv[0].shape[0] - 2 * kv_width
        q, k, v = F.linear(h, *qkv).split([q_width, kv_width, kv_width], dim=-1)
    q = q.reshape(batch, length, -1, head_dim)
    k = k.reshape(batch, length, -1, head_dim)
    v = v.reshape(batch, length, -1, head_dim)
    if hasattr(attn, "q_norm"):  # Qwen3 normalises each head before the rotation
        q, k = attn.q_norm(q), attn.k_norm(k)
    q = _rotate(q.transpose(1, 2), cos, sin)
    k = _rotate(k.transpose(1, 2), cos, sin).to(cache_dtype)
    return q, k, v.transpose(1, 2).to(cache_dtype)


def decode_layer(layer, x, cos, sin, hidden, keys, values, slot, fused=None) -> torch.Tensor:
    """One decoder layer for one new token per row: write its key/value to cache `slot`, attend over
    the cache's leading window (as many slots as `hidden`, which masks padding and unwritten slots),
    then the MLP. A plain function of its inputs, so one compiled graph serves every layer of the
    model, and (shapes symbolic) every window. `fused`: the layer's `fuse_projections` copies, whose
    matmuls replace q/k/v's three and gate/up's two.

    The whole cache comes in and the window is sliced here, after the write: handed a window view
    instead, a compiled step writes the mutated view back in full on every call, several times slower
    at long windows (docs/performance.md, "Why the code does it this way")."""
    attn = layer.self_attn
    # Sizes come from the cache's constant dimensions (see `_static_dims`), not from int arguments or module
    # attributes: with symbolic shapes an int argument is a symbol, and so is an int attribute of a module
    # FSDP2 manages; every reshape by a symbol is then a symbolic expression to reason about.
    kv_heads, head_dim = keys.shape[1], keys.shape[-1]
    scaling = getattr(attn, "scaling", head_dim ** -0.5)
    batch = x.shape[0]
    q, k, v = _project(attn, layer.input_layernorm(x), cos, sin, head_dim, keys.dtype,
                       None if fused is None else fused[:2], kv_width=kv_heads * head_dim)
    keys[:, :, slot] = k
    values[:, :, slot] = v
    window = hidden.shape[-1]
    keys, values = keys[:, :, :window], values[:, :, :window]
    # query heads grouped by their shared KV head (head h reads KV head h // groups): no repeated cache copy
    qg = q.reshape(batch, kv_heads, -1, head_dim)
    scores = torch.matmul(qg, keys.transpose(-1, -2)).float() * scaling
    weights = torch.softmax(scores.masked_fill(hidden, float("-inf")), dim=-1).to(values.dtype)
    out = torch.matmul(weights, values).reshape(batch, -1, 1, head_dim)
    x = x + attn.o_proj(out.transpose(1, 2).reshape(batch, 1, -1))
    h = layer.post_attention_layernorm(x)
    if fused is None:
        return x + layer.mlp(h)
    gate, up = F.linear(h, fused[2]).chunk(2, dim=-1)
    return x + layer.mlp.down_proj(layer.mlp.act_fn(gate) * up)


def fuse_projections(layer: nn.Module, dtype: torch.dtype):
    """(q/k/v weight, their bias or None, gate/up weight): one layer's projections that read the same input,
    concatenated into one matrix each, in `dtype`, for `decode_layer`. A copy of the weights as they are now,
    so made per decoder (per rollout, after the update). None where a projection is not a plain `nn.Linear`
    (an adapter or a quantized layer would be bypassed) or the MLP has no `act_fn`."""
    attn, mlp = layer.self_attn, getattr(layer, "mlp", None)
    qkv = [getattr(attn, name, None) for name in ("q_proj", "k_proj", "v_proj")]
    gate_up = [getattr(mlp, name, None) for name in ("gate_proj", "up_proj")]
    if any(type(m) is not nn.Linear for m in qkv + gate_up) or not hasattr(mlp, "act_fn"):
        return None
    with torch.no_grad():
        bias = None
        if any(m.bias is not None for m in qkv):
            bias = torch.cat([m.bias if m.bias is not None else m.weight.new_zeros(m.out_features) for m in qkv])
            bias = bias.to(dtype)
        return (torch.cat([m.weight for m in qkv]).to(dtype), bias,
                torch.cat([m.weight for m in gate_up]).to(dtype))


# `StaticDecoder._shapes` of every window this process has warmed up and recorded
_warmed: set = set()


@functools.lru_cache(maxsize=None)
def _warmup_stream(device: torch.device) -> torch.cuda.Stream:
    """The one side stream every recording's warm-up runs on, per device. cuBLAS keeps a workspace for
    each stream it has run on for the life of the process, so a new stream per recording (a decoder per
    generate call, a graph per window) grows device memory every step until torch's stream pool wraps
    around."""
    return torch.cuda.Stream(device=device)


def compiled_decode_step(backend, compiler):
    """`decode_layer` behind `compiler`'s switch (verl/utils/compile_beside.py): eager until the compiled
    step, built beside the first rollouts, takes over at a pass boundary."""
    return compiler.function("decode step", decode_layer, _compiled_layer_step(backend))


@functools.lru_cache(maxsize=None)
def _compiled_layer_step(backend):
    """`decode_layer` under torch.compile with `backend`, shapes symbolic from the first call: every
    cache shape (chunk sizes, prompt widths, validation) then runs the one compiled graph. One wrapper
    per backend for the process, since each new wrapper would compile afresh. The window views
    (a prefix of the cache's slot dimension) run the same graph too."""
    return torch.compile(decode_layer, backend=backend, fullgraph=True, dynamic=True)
