"""FSDP plumbing for the workers: process group, sharding, offload, full-parameter generation, memory.

Sharding uses FSDP2 (`fully_shard`: per-parameter DTensor shards), which runs the same on CUDA with
the plan's backend and on CPU with gloo, so the CPU test suite exercises the real sharded code path.
Every choice that depends on the hardware (backend, dtypes, offload) arrives in the compat plan.
"""
from __future__ import annotations

import contextlib
import functools
import os
import resource
from datetime import timedelta

import torch
import torch.distributed as dist

from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

DEFAULT_TIMEOUT_S = 600


def init_distributed(backend: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> tuple[int, int]:
    """Join (or create) the default process group; returns (rank, world_size).

    Rank and world size come from the environment the worker group sets (RANK, WORLD_SIZE,
    MASTER_ADDR, MASTER_PORT). Without WORLD_SIZE, or with WORLD_SIZE=1 and no MASTER_ADDR, a
    private one-rank group is made, so a worker also runs in a plain Python process.
    """
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    timeout = timedelta(seconds=timeout_s)
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1 and "MASTER_ADDR" not in os.environ:
        dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)
    else:
        missing = [k for k in ("RANK", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
        if missing:
            raise RuntimeError(f"WORLD_SIZE={world_size} but {missing} not set; the worker group sets these per worker")
        dist.init_process_group(backend=backend, timeout=timeout)
    return dist.get_rank(), dist.get_world_size()


def _layer_classes(model: torch.nn.Module) -> set[str]:
    """Class names of the repeated blocks (transformers lists them as `_no_split_modules`)."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    if not names:
        raise ValueError(f"{type(model).__name__} declares no _no_split_modules; cannot find its layers to shard")
    return names


def shard_model(
    model: torch.nn.Module,
    *,
    param_dtype: torch.dtype,
    compute_dtype: torch.dtype,
    cast_params_for_compute: bool,
    reduce_dtype: torch.dtype,
    param_offload: bool,
    device_type: str,
    mesh=None,
    reshard_after_forward: bool = True,
) -> torch.nn.Module:
    """Shard `model` with FSDP2: one unit per transformer layer plus the root (embeddings, head).

    All choices are the role plan's (verl.compat): with `cast_params_for_compute`, parameters
    are all-gathered in `compute_dtype`, otherwise in `param_dtype` (autocast then down-casts, which
    the fp16 numerics guard can switch off at run time); gradients are reduce-scattered in
    `reduce_dtype`; `param_offload` keeps shards in host memory (FSDP2's CPUOffloadPolicy);
    `reshard_after_forward=False` keeps each unit gathered from its forward to its backward.
    """
    kwargs = {"reshard_after_forward": reshard_after_forward}
    if mesh is not None:
        kwargs["mesh"] = mesh
    gather_dtype = compute_dtype if cast_params_for_compute else param_dtype
    if {p.dtype for p in model.parameters()} - {gather_dtype}:
        # frozen weights stored in another dtype than they compute in (verl.workers.model_building.frozen_weights:
        # a float16 reference, or a LoRA base beside float32 adapters): FSDP2 casts every parameter of a unit to
        # the gather dtype as it gathers it, one layer at a time. Without the policy, weights all stored in
        # float16 would be gathered, and computed with, in float16.
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=gather_dtype, reduce_dtype=reduce_dtype)
    elif gather_dtype != param_dtype or reduce_dtype != gather_dtype:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=gather_dtype if gather_dtype != param_dtype else None,
                                                   reduce_dtype=reduce_dtype)
    if param_offload:
        # FSDP2's own policy: shards and their gradients stay in host memory, each forward/backward
        # all-gathers onto the mesh's device, and the optimizer step runs on the host shards. Pinned
        # host memory (faster, asynchronous copies) needs an accelerator runtime to allocate it.
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=torch.accelerator.is_available())
    if not param_offload:
        _to_device(model, device_type)
    layer_names = _layer_classes(model)
    for module in model.modules():
        if type(module).__name__ in layer_names:
            fully_shard(module, **kwargs)
    fully_shard(model, **kwargs)
    for unit in fsdp_modules(model):
        # Average gradients as SUM then divide: under AVG, gloo's reduce-scatter sums in torch 2.8
        # (doubled gradients at world size 2). SUM means the same on every backend.
        unit.set_force_sum_reduction_for_comms(True)
    model._planned_reshard_after_forward = reshard_after_forward
    if not reshard_after_forward:
        _reshard_forwards_without_grad(model)
    return model


def _to_device(model: torch.nn.Module, device_type: str) -> None:
    """Move `model` to this process's current device (nothing to do on CPU)."""
    if device_type != "cpu":
        model.to(torch.device(device_type, torch.get_device_module(device_type).current_device()))


def place_unwrapped(model: torch.nn.Module, device_type: str) -> torch.nn.Module:
    """`model` on this process's device, as stored: what a plan that does not wrap it in FSDP2 runs
    (one device, no cast on gather, no offload: every pass reads these weights in place).

    The input embedding's gradient is added row by row into its `.grad` (`rows_into_grad`) instead of
    being materialised as a vocabulary-sized matrix. Tied to the output projection, the weight's two
    gradients are then never summed out of place in backward, which ends holding the `.grad` alone
    instead of three vocabulary matrices (two with sparse embedding gradients).
    Only here: under FSDP2 the weight's `.grad` is the gathered parameter's, which FSDP2 reduces itself."""
    _to_device(model, device_type)
    inputs = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if isinstance(inputs, torch.nn.Embedding):
        rows_into_grad(inputs)
    return model


def rows_into_grad(embedding: torch.nn.Embedding) -> torch.nn.Embedding:
    """Make `embedding` add its gradient rows straight into `weight.grad` (dense) during backward.

    The lookup gives the weight no graph edge (`_RowsIntoGrad` holds the module, not the tensor), so
    autograd never holds a whole (vocab, hidden) embedding gradient, and a weight tied to the output
    projection takes that projection's gradient into `.grad` as soon as it is computed, instead of
    at the end of backward next to a second matrix to sum it with. The summed `.grad` is the same as
    the dense one. Lookups without gradients (generation, scoring) are plain `F.embedding`."""
    if embedding.max_norm is not None or embedding.scale_grad_by_freq or not embedding.weight.requires_grad:
        return embedding   # renormalising or frequency-scaled lookups keep torch's own backward; frozen ones need none
    embedding.forward = functools.partial(_lookup_rows_into_grad, embedding)
    return embedding


def _lookup_rows_into_grad(embedding: torch.nn.Embedding, ids: torch.Tensor) -> torch.Tensor:
    if not (torch.is_grad_enabled() and embedding.weight.requires_grad):
        return torch.nn.functional.embedding(ids, embedding.weight, embedding.padding_idx)
    # the output needs a graph node for backward to reach the lookup: an empty leaf stands in for the weight
    anchor = torch.empty(0, device=ids.device, requires_grad=True)
    return _RowsIntoGrad.apply(anchor, ids, embedding)


class _RowsIntoGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, anchor, ids, embedding):
        ctx.save_for_backward(ids)
        ctx.embedding = embedding
        return torch.nn.functional.embedding(ids, embedding.weight.detach(), embedding.padding_idx)

    @staticmethod
    def backward(ctx, grad):
        (ids,) = ctx.saved_tensors
        weight, padding_idx = ctx.embedding.weight, ctx.embedding.padding_idx
        rows, flat = grad.reshape(-1, grad.shape[-1]), ids.reshape(-1)
        if padding_idx is not None:   # the padding row gets no gradient, as in torch's embedding backward
            rows = rows * (flat != padding_idx).unsqueeze(-1).to(rows.dtype)
        if weight.grad is None:
            weight.grad = torch.zeros_like(weight)
        weight.grad.index_add_(0, flat, rows.to(weight.grad.dtype))
        return None, None, None


def _reshard_forwards_without_grad(model: torch.nn.Module) -> None:
    """Weights are kept gathered after forward for the backward that follows; a forward without
    gradients (log-probs, values, the numerics guard) has none, and would leave the whole model
    gathered until the next update. Such forwards reshard as they go, except inside `full_params`."""
    def before(module, _args):
        if not torch.is_grad_enabled() and not getattr(module, "_holding_full_params", False):
            module.set_reshard_after_forward(True)

    def after(module, _args, _output):
        if not torch.is_grad_enabled() and not getattr(module, "_holding_full_params", False):
            module.set_reshard_after_forward(False)

    model.register_forward_pre_hook(before)
    model.register_forward_hook(after)


def fsdp_modules(model: torch.nn.Module) -> list:
    return [m for m in model.modules() if isinstance(m, FSDPModule)]


@contextlib.contextmanager
def full_params(model: torch.nn.Module):
    """Hold the whole model unsharded, so forwards inside issue no collectives.

    Generation runs a data-dependent number of forwards per rank (ranks stop at different EOS
    steps); per-layer all-gathers would then deadlock. Gathering once up front avoids that.
    """
    units = fsdp_modules(model)
    for unit in units:
        unit.set_reshard_after_forward(False, recurse=False)
    for unit in units:
        unit.unshard()
    model._holding_full_params = True
    try:
        yield model
    finally:
        model._holding_full_params = False
        for unit in units:
            unit.reshard()
            unit.set_reshard_after_forward(getattr(model, "_planned_reshard_after_forward", True), recurse=False)


def clip_grad_norm(parameters, max_norm: float) -> torch.Tensor:
    """Global grad norm over all shards (a plain tensor), clipping to `max_norm`."""
    params = [p for p in parameters if p.grad is not None]
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm=max_norm)
    if hasattr(norm, "full_tensor"):
        norm = norm.full_tensor()
    return norm.detach().float().cpu()


def _shard_device(param: torch.Tensor) -> torch.device:
    """Where a parameter's local shard (the tensor the optimizer updates) lives."""
    return param.to_local().device if isinstance(param, DTensor) else param.device


def move_optimizer_state(optimizer: torch.optim.Optimizer, device, *, keep_host_shards: bool = False,
                         non_blocking: bool = False) -> None:
    """Move the optimizer's per-element state to `device`.

    With `keep_host_shards`, the state of a parameter whose shard lives in host memory stays there:
    that is where its step runs. Scalar state (AdamW's `step`) stays where the optimizer keeps it
    (torch holds it on the host unless the optimizer is fused/capturable). Copies are blocking unless
    `non_blocking` (only for copies *to* a device, which later work on its stream waits for), so a
    tensor moved to the host is complete before anything (a checkpoint save) reads it.
    """
    device = torch.device(device)
    for group in optimizer.param_groups:
        for param in group["params"]:
            state = optimizer.state.get(param)
            if not state:
                continue
            target = device
            if keep_host_shards and _shard_device(param).type == "cpu":
                target = torch.device("cpu")
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and value.dim() > 0 and value.device != target:
                    state[key] = value.to(target, non_blocking=non_blocking and target.type != "cpu")


def offload_optimizer_state(optimizer: torch.optim.Optimizer, device) -> None:
    """Keep the optimizer's state in host memory except while `optimizer.step()` runs on `device`.

    The state (two float32 tensors per parameter for AdamW) is read only by the step, so it comes to
    `device` right before each step and goes back right after it: forwards and backwards (whose
    activations are the largest transient) never share the device with it, which is what the memory
    model assumes (held for a whole update, it would sit next to the update's activations from the
    second step on, once the state exists). With param offload FSDP2's CPUOffloadPolicy keeps shards and gradients in host
    memory and steps them there, so their state never moves to `device`. State the optimizer creates
    lazily (its first step) is made beside the shard by torch and sent to the host after that step.

    The host copies live in page-locked buffers made once and reused every step, so both copies run
    at the bus's DMA speed without a staging copy (pageable copies halve that speed: docs/performance.md,
    "Why the code does it this way").
    """
    accelerator = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    pinned = _PinnedHostState(pin=accelerator is not None and torch.device(device).type == accelerator.type)

    def to_device(opt, args, kwargs) -> None:   # a pre-hook's return value would replace the step's arguments
        move_optimizer_state(opt, device, keep_host_shards=True, non_blocking=True)

    def to_host(opt, args, kwargs) -> None:
        pinned.store(opt)

    optimizer.register_step_pre_hook(to_device)
    optimizer.register_step_post_hook(to_host)


def host_cores() -> int:
    """The host cores this process may run on (its CPU affinity where the OS reports one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:   # no affinity call on this OS
        return os.cpu_count() or 1


def step_on_all_host_cores(optimizer: torch.optim.Optimizer) -> None:
    """Run each step of `optimizer` with every host core where its parameters live in host memory.

    An offloaded role steps its shards on the host (FSDP2's CPUOffloadPolicy): AdamW over a 1.5B model's
    float32 state is several GB of memory traffic, bounded by how many cores share it. Ray starts workers
    with one intra-op thread (OMP_NUM_THREADS=1) unless told otherwise, which leaves the step on one core;
    the thread count is raised for the step and restored after it, so the rest of the worker (and other
    processes on the host) keep what they were given."""
    host_params = any(_shard_device(p).type == "cpu" for g in optimizer.param_groups for p in g["params"])
    cores = host_cores()
    if not host_params or cores <= torch.get_num_threads():
        return
    before: list[int] = []

    def widen(opt, args, kwargs) -> None:
        before.append(torch.get_num_threads())
        torch.set_num_threads(cores)

    def restore(opt, args, kwargs) -> None:
        if before:
            torch.set_num_threads(before.pop())

    optimizer.register_step_pre_hook(widen)
    optimizer.register_step_post_hook(restore)


class _PinnedHostState:
    """One page-locked host buffer per optimizer state tensor; `store` copies the state into them."""

    def __init__(self, pin: bool):
        self.pin = pin
        self.buffers: dict[tuple[int, str], torch.Tensor] = {}

    def store(self, optimizer: torch.optim.Optimizer) -> None:
        copied = False
        for group in optimizer.param_groups:
            for param in group["params"]:
                state = optimizer.state.get(param)
                for key, value in (state or {}).items():
                    if not isinstance(value, torch.Tensor) or value.dim() == 0 or value.device.type == "cpu":
                        continue
                    buf = self.buffers.get((id(param), key))
                    if buf is None or buf.shape != value.shape or buf.dtype != value.dtype:
                        # a DTensor's like-op keeps its mesh and placements and makes the local tensor
                        # here (DTensor.from_local would move a host tensor back to the mesh's device)
                        buf = torch.empty_like(value, device="cpu", pin_memory=self.pin)
                        self.buffers[(id(param), key)] = buf
                    buf.copy_(value, non_blocking=self.pin)
                    state[key] = buf
                    copied = True
        if copied and self.pin:
            # the copies must be complete before the host reads the buffers (a checkpoint save) and
            # before the device memory they come from is reused; the step has just ended anyway
            torch.accelerator.synchronize()


_GIB = 1024**3
# the process's allocator peaks from before the last `phase_peak` reset (the allocator's own peak then
# covers only the phase since), so the run-long metrics keep upstream's meaning: peak since start
_EARLIER_PEAKS = {"allocated": 0, "reserved": 0}


@contextlib.contextmanager
def phase_peak(device_type: str, phase: str):
    """Yields a dict that receives, on exit, the call's own allocator peak as
    `perf/max_memory_allocated_gb/<phase>`.

    The run-long peak cannot say which phase set it (training or validation, update or scoring);
    the memory plan predicts each phase, so the matrix compares them phase by phase. Nothing is
    recorded on CPU, where there is no device allocator.
    """
    metrics: dict[str, float] = {}
    if device_type == "cpu":
        yield metrics
        return
    mod = torch.get_device_module(device_type)
    _EARLIER_PEAKS["allocated"] = max(_EARLIER_PEAKS["allocated"], mod.max_memory_allocated())
    _EARLIER_PEAKS["reserved"] = max(_EARLIER_PEAKS["reserved"], mod.max_memory_reserved())
    mod.reset_peak_memory_stats()
    yield metrics
    metrics[f"perf/max_memory_allocated_gb/{phase}"] = mod.max_memory_allocated() / _GIB


def memory_metrics(device_type: str) -> dict[str, float]:
    """Upstream's perf/* memory metrics, in GiB: peaks since the process started.

    On an accelerator these are the allocator's peaks; on CPU the process's peak resident set
    stands in for both, since there is no device allocator.
    """
    host_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / _GIB
    metrics = {"perf/cpu_memory_used_gb": host_peak}
    if device_type == "cpu":
        metrics["perf/max_memory_allocated_gb"] = host_peak
        metrics["perf/max_memory_reserved_gb"] = host_peak
    else:
        mod = torch.get_device_module(device_type)
        allocated = max(_EARLIER_PEAKS["allocated"], mod.max_memory_allocated())
        reserved = max(_EARLIER_PEAKS["reserved"], mod.max_memory_reserved())
        metrics["perf/max_memory_allocated_gb"] = allocated / _GIB
        metrics["perf/max_memory_reserved_gb"] = reserved / _GIB
    return metrics


def global_batch_info(response_mask: torch.Tensor, dp_group=None, sp_size: int = 1) -> dict[str, int]:
    """Denominators of the loss over the whole data-parallel mini-batch.

    Each micro-batch loss is normalised by the token (or sequence) count of the *global* mini-batch
    and multiplied by the data-parallel size (gradient reduction averages over ranks), so the
    accumulated gradient does not depend on how the mini-batch is cut into micro-batches or ranks.
    With Ulysses (`sp_size` > 1) the ranks of a sequence-parallel group hold the same rows: they are
    counted once, and the data-parallel size is the group's ranks / sp.
    """
    counts = torch.tensor(
        [int(response_mask.sum().item()), int((response_mask.sum(dim=-1) > 0).sum().item())], dtype=torch.long
    )
    ranks = 1
    if dist.is_initialized():
        ranks = dist.get_world_size(dp_group)
        if ranks > 1:
            dist.all_reduce(counts, op=dist.ReduceOp.SUM, group=dp_group)
    counts = counts // sp_size
    return {
        "dp_size": max(ranks // sp_size, 1),
        "batch_num_tokens": max(int(counts[0]), 1),
        "global_batch_size": max(int(counts[1]), 1),
    }


def optimizer_step(optimizer, parameters, grad_clip: float | None, scaler=None) -> tuple[float, bool]:
    """Clip and step; returns (grad_norm, stepped).

    A non-finite gradient norm skips the update (as upstream does) instead of writing NaNs into the
    weights. With a grad scaler the gradients are unscaled first and the scaler decides the skip
    (and lowers its scale).
    """
    params = list(parameters)
    if scaler is not None:
        scaler.unscale_(optimizer)
    max_norm = grad_clip if grad_clip is not None and grad_clip > 0 else float("inf")
    grad_norm = float(clip_grad_norm(params, max_norm))
    if scaler is not None:
        scale_before = scaler.get_scale()
        scaler.step(optimizer)
        scaler.update()
        stepped = scaler.get_scale() >= scale_before
    elif torch.isfinite(torch.tensor(grad_norm)):
        optimizer.step()
        stepped = True
    else:
        stepped = False
    optimizer.zero_grad(set_to_none=True)
    return grad_norm, stepped
