"""torch.compile for the repeated decoder layers of a trained or scoring model (the plan's torch_compile).

Most of a layer's device time outside its matmuls and attention is small elementwise kernels (RMSNorm,
rotary, SiLU gating, residual adds, dtype casts); compiling the layer fuses them. Only each layer's
`forward` is compiled, and before FSDP2 shards the model: FSDP2's hooks run around `forward` in
`nn.Module.__call__`, so its all-gathers and reduce-scatters stay outside the compiled region.

Gradient checkpointing stays outside the compiled region too. transformers 4.x checkpoints the layer's
`__call__`, around this `forward`. transformers 5.x checkpoints inside the class's `forward`; compiled,
that would put torch.utils.checkpoint inside the graph, where dynamo refuses any write to state from
outside the region (backward's recompute would not replay it), such as the hub `kernels` package's
context variable set in every attention call, and falls back to eager for the whole layer. So the compiled code is the class's forward
without transformers' checkpointing wrapper, and a 5.x layer that transformers would checkpoint is
checkpointed here instead, with the function and arguments transformers set on it
(`_gradient_checkpointing_func`, per layer, so `every_n_layers` holds): the compiled forward runs again
in backward, and only the layer's inputs are kept between the passes.

All layers run the same code, so one compiled graph per kind of pass (grad mode, autocast state)
serves every layer, and the reference and value models of the same class too.

Shapes are compiled dynamic (`dynamic=True`) from the first call: micro-batches differ in rows and
in padded width (64-column steps, `verl.utils.packing`) and packed rows in length; left to
torch's automatic dynamic shapes the first call would compile a static graph and the second a
dynamic one, so the dynamic one is compiled once up front.

A vision-language model's vision blocks stay eager: each call carries its images' patch counts
(`cu_seqlens`) and the attention splits at them, so a compiled block would be retraced for every new
mix of image sizes; the decoder layers after the tower are compiled as for a text model.

With a `BesideCompiler` (the plan's compile_warmup=background) the layers run eagerly until the
compiled code, built beside the first passes, takes over at a pass boundary
(verl/utils/compile_beside.py); one switch serves every layer of every model of the process.

A call with a KV cache (generation through transformers' forward) runs the layer eagerly: decoding
is not what this compiles for, and a cache object would be traced per step. The built-in rollout's
static decoder calls the layers' submodules directly and never goes through this `forward`.
"""
from __future__ import annotations

import functools
from typing import Callable

import torch

from verl.utils.fsdp_utils import _layer_classes
from verl.workers.model_building.loading import vision_tower

# torch.compile's default (triton kernels on a GPU); the plan turns compilation on only where triton
# is usable. Tests pass a backend that generates no code.
BACKEND = "inductor"

# the names transformers has used for a layer's KV cache argument (4.x, 4.5x, 5.x)
_CACHE_KWARGS = ("cache", "past_key_values", "past_key_value")


def compile_decoder_layers(model: torch.nn.Module, backend: str | Callable | None = None, compiler=None) -> int:
    """Compile the `forward` of every decoder layer of `model` (unsharded) in place; the layer count.

    `backend` is torch.compile's (default `BACKEND`); `compiler`: a BesideCompiler that decides when
    the compiled code runs (None: from the first call). Parameters, state dict and module tree are
    unchanged (checkpoints and weight syncs see the same names)."""
    names = _layer_classes(model)
    tower = vision_tower(model)
    skip = {id(m) for m in tower.modules()} if tower is not None else set()
    layers = [m for m in model.modules() if type(m).__name__ in names and id(m) not in skip]
    compiled = _compiled_run(backend or BACKEND)
    step = compiled if compiler is None else compiler.function("decoder layers", _run, compiled)
    for layer in layers:
        _compile_forward(layer, step)
    return len(layers)


@functools.lru_cache(maxsize=None)
def _compiled_run(backend: str | Callable) -> Callable:
    """One compiled `_run` per backend for the process: every layer runs the same code, so dynamo's
    graphs (one per kind of pass) serve every layer of every model."""
    return torch.compile(_run, backend=backend, dynamic=True)


@functools.cache
def _checkpointing_wrapper_code():
    """The code object of transformers 5.x's checkpointing wrapper around a layer class's forward, or
    None where the layer's call is checkpointed instead (4.x)."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    class Probe(GradientCheckpointingLayer):
        def forward(self):
            return None

    return Probe.forward.__code__ if hasattr(Probe.forward, "__wrapped__") else None


def _plain_forward(cls: type) -> tuple[Callable, bool]:
    """The class's forward without transformers' checkpointing wrappers, and whether it had any.

    Looked up per call: FSDP2 swaps in a subclass when it shards the layer, and transformers 5 wraps
    every subclass's forward again."""
    forward, code, wrapped = cls.forward, _checkpointing_wrapper_code(), False
    while code is not None and getattr(forward, "__code__", None) is code:
        forward, wrapped = forward.__wrapped__, True
    return forward, wrapped


def _run(forward: Callable, layer: torch.nn.Module, *args, **kwargs):
    return forward(layer, *args, **kwargs)


def _static_feature_dims(args: tuple, kwargs: dict) -> None:
    """Mark the hidden size of the layer's input and the head size of its rotary tables as constants: shapes
    compile symbolic (`dynamic=True`), and a symbol for a model constant costs symbolic reasoning at every op
    that reads it. Only the token (and row) dimensions vary between calls. Read by dynamo only when it compiles."""
    hidden = args[0] if args else kwargs.get("hidden_states")
    if isinstance(hidden, torch.Tensor):
        torch._dynamo.mark_static(hidden, hidden.dim() - 1)
    for table in kwargs.get("position_embeddings") or ():
        if isinstance(table, torch.Tensor):
            torch._dynamo.mark_static(table, table.dim() - 1)


def trace_as_plain_modules(model: torch.nn.Module) -> int:
    """After FSDP2 has sharded `model`: let dynamo trace its compiled layers as it traces unwrapped modules;
    the number of layers.

    FSDP2 marks every module it manages (`_is_fsdp_managed_module`) so that dynamo can trace its hooks inside a
    compiled region. Here the hooks run outside the compiled forward, and the mark only changes how dynamo reads
    the modules: with symbolic shapes, int attributes of marked modules (a layer's `head_dim`,
    `num_key_value_groups`) become symbols, where an unmarked module's are constants, and every reshape by such a
    symbol is symbolic reasoning at compile time (docs/performance.md, "Why the code does it this way")."""
    layers = [m for m in model.modules() if getattr(m.forward, _COMPILED_MARK, False)]
    for layer in layers:
        for module in layer.modules():
            if getattr(module, "_is_fsdp_managed_module", False):
                module._is_fsdp_managed_module = False
    return len(layers)


_COMPILED_MARK = "_verl_compiled_forward"


def _compile_forward(layer: torch.nn.Module, compiled: Callable) -> None:
    def forward(*args, **kwargs):
        if kwargs.get("use_cache") or any(kwargs.get(k) is not None for k in _CACHE_KWARGS):
            return type(layer).forward(layer, *args, **kwargs)
        _static_feature_dims(args, kwargs)
        plain, wrapped = _plain_forward(type(layer))
        if wrapped and layer.gradient_checkpointing and layer.training and torch.is_grad_enabled():
            return layer._gradient_checkpointing_func(functools.partial(compiled, plain, layer, **kwargs), *args)
        return compiled(plain, layer, *args, **kwargs)

    setattr(forward, _COMPILED_MARK, True)
    layer.forward = forward
