"""`register`: marks a worker method for the worker group, with how its arguments are split and joined.

A registered method `m` on a Worker class becomes `group.m(...)` on the driver. The call runs
    dispatch_fn(group, *args, **kwargs) -> per-worker args  ->  execute on workers  ->  collect_fn(group, outputs)
`Dispatch` names the built-in (dispatch_fn, collect_fn) pairs; a dict {"dispatch_fn", "collect_fn"} gives a
custom pair. `Execute` says whether every worker or only rank 0 runs the method.
"""

from __future__ import annotations

import functools
import inspect
from enum import Enum
from functools import partial
from types import FunctionType

from verl.protocol import (  # noqa: F401  (the timeout is re-exported: the worker groups read it here)
    DataProto,
    DataProtoFuture,
    _is_tensordict,
    _padding_size_key,
    chunk_batch,
    concat_batches,
    pad_dataproto_to_divisor,
    ray_get_timeout,
)

# attribute `register` sets on the function; the worker group looks for it
MAGIC_ATTR = "_verl_register_attrs"

class Dispatch(Enum):
    """How a call's arguments reach the workers and how their outputs come back."""

    RANK_ZERO = "rank_zero"  # only rank 0 runs; its single output is returned
    ONE_TO_ALL = "one_to_all"  # every worker gets the same arguments; list of outputs
    ALL_TO_ALL = "all_to_all"  # arguments passed through as given (lists of world_size are split); list of outputs
    DP_COMPUTE = "dp_compute"  # every argument is already a list of world_size; list of outputs
    DP_COMPUTE_PROTO = "dp_compute_proto"  # DataProto arguments chunked by world size; outputs concatenated
    DP_COMPUTE_PROTO_WITH_FUNC = "dp_compute_proto_with_func"  # as above, first argument a function for all
    DP_COMPUTE_METRIC = "dp_compute_metric"  # DataProto chunked; list of outputs (one per worker)


class Execute(Enum):
    ALL = "all"
    RANK_ZERO = "rank_zero"


# ---- dispatch / collect functions ---------------------------------------------------------------


def dispatch_one_to_all(worker_group, *args, **kwargs):
    n = worker_group.world_size
    return tuple([a] * n for a in args), {k: [v] * n for k, v in kwargs.items()}


def dispatch_all_to_all(worker_group, *args, **kwargs):
    return args, kwargs


def collect_all_to_all(worker_group, output):
    return output


def dispatch_dp_compute(worker_group, *args, **kwargs):
    n = worker_group.world_size
    for name, value in [*enumerate(args), *kwargs.items()]:
        if not isinstance(value, (list, tuple)) or len(value) != n:
            raise ValueError(f"DP_COMPUTE argument {name!r} must be a list with one entry per worker ({n})")
    return args, kwargs


def collect_dp_compute(worker_group, output):
    if len(output) != worker_group.world_size:
        raise ValueError(f"expected {worker_group.world_size} outputs, got {len(output)}")
    return output


def _chunk_data_args(n: int, args, kwargs, pad: bool):
    """Chunk every DataProto (or TensorDict) argument into n parts; pad DataProtos to a multiple of n first
    when allowed."""
    named = [*enumerate(args), *kwargs.items()]
    for name, value in named:
        if not isinstance(value, (DataProto, DataProtoFuture)) and not _is_tensordict(value):
            raise TypeError(
                f"argument {name!r} is a {type(value).__name__}; DataProto dispatch modes take only DataProto "
                "or TensorDict arguments (put scalars in meta_info)"
            )
    lengths = {len(v) for _, v in named if isinstance(v, DataProto)}
    pad_size = 0
    if pad and any(isinstance(v, DataProto) and v.is_padding_enabled() for _, v in named):
        if len(lengths) > 1:
            raise ValueError(f"auto-padded DataProto arguments must have one length, got {sorted(lengths)}")
        padded = {}
        for name, value in named:
            if isinstance(value, DataProto):
                value, pad_size = pad_dataproto_to_divisor(value, n)
            padded[name] = value
        named = list(padded.items())
    chunked = {name: chunk_batch(value, n) for name, value in named}
    new_args = tuple(chunked[i] for i in range(len(args)))
    new_kwargs = {k: chunked[k] for k in kwargs}
    if pad_size:
        new_kwargs[_padding_size_key] = pad_size
    return new_args, new_kwargs


def dispatch_dp_compute_data_proto(worker_group, *args, **kwargs):
    return _chunk_data_args(worker_group.world_size, args, kwargs, pad=True)


def dispatch_dp_compute_data_proto_with_func(worker_group, func, *args, **kwargs):
    if not isinstance(func, FunctionType):
        raise TypeError(f"DP_COMPUTE_PROTO_WITH_FUNC needs a function as first argument, got {type(func).__name__}")
    new_args, new_kwargs = _chunk_data_args(worker_group.world_size, args, kwargs, pad=False)
    return ([func] * worker_group.world_size, *new_args), new_kwargs


def collect_dp_compute_data_proto(worker_group, output):
    output = collect_dp_compute(worker_group, output)
    if all(isinstance(o, DataProto) or _is_tensordict(o) for o in output):
        return concat_batches(output)
    import ray

    if all(isinstance(o, ray.ObjectRef) for o in output):  # non-blocking call: join lazily
        return DataProtoFuture.concat(output)
    raise TypeError(f"DP_COMPUTE_PROTO methods must return DataProto, got {[type(o).__name__ for o in output]}")


# ---- nd dispatch: workers grouped by their data-parallel rank in a named device mesh -----------------


def dispatch_nd_compute(dp_rank_mapping: list[int], dp_size: int, worker_group, *args, **kwargs):
    """Every argument is a list of `dp_size` parts; worker i gets part dp_rank_mapping[i]."""
    if len(dp_rank_mapping) != worker_group.world_size:
        raise ValueError(f"dp_rank_mapping has {len(dp_rank_mapping)} entries for {worker_group.world_size} workers")
    for name, value in [*enumerate(args), *kwargs.items()]:
        if not isinstance(value, (list, tuple)) or len(value) != dp_size:
            raise ValueError(f"argument {name!r} must be a list of {dp_size} parts (one per data-parallel rank)")
    pick = lambda parts: [parts[rank] for rank in dp_rank_mapping]  # noqa: E731
    return tuple(pick(a) for a in args), {k: pick(v) for k, v in kwargs.items()}


def collect_nd_compute(collect_mask: list[bool], worker_group, output):
    """The outputs of the workers whose mask entry is True (one per data-parallel rank), in rank order."""
    if len(output) != worker_group.world_size or len(collect_mask) != worker_group.world_size:
        raise ValueError(f"expected {worker_group.world_size} outputs and mask entries")
    return [out for out, keep in zip(output, collect_mask) if keep]


def dispatch_nd_compute_dataproto(dp_rank_mapping: list[int], dp_size: int, worker_group, *args, **kwargs):
    """DataProto arguments chunked into `dp_size` parts, then handed out by data-parallel rank."""
    chunked_args, chunked_kwargs = _chunk_data_args(dp_size, args, kwargs, pad=False)
    return dispatch_nd_compute(dp_rank_mapping, dp_size, worker_group, *chunked_args, **chunked_kwargs)


def collect_nd_compute_dataproto(collect_mask: list[bool], worker_group, output):
    """The collected workers' DataProtos concatenated (a future joined lazily for non-blocking calls)."""
    output = collect_nd_compute(collect_mask, worker_group, output)
    if all(isinstance(o, DataProto) or _is_tensordict(o) for o in output):
        return concat_batches(output)
    return DataProtoFuture.concat(output)


def dispatch_lazy_compute_data_proto(mesh_name: str, worker_group, *args, **kwargs):
    """nd dispatch for mesh `mesh_name`, asking the workers their data-parallel ranks on first use."""
    if mesh_name not in worker_group._dispatch_info:
        ranks = worker_group._query_dispatch_info(mesh_name)
        if len(ranks) != worker_group.world_size:
            raise ValueError(f"mesh {mesh_name!r}: {len(ranks)} workers answered of {worker_group.world_size}")
        worker_group._dispatch_info[mesh_name] = ranks
    mapping = worker_group._dispatch_info[mesh_name]
    return dispatch_nd_compute_dataproto(mapping, max(mapping) + 1, worker_group, *args, **kwargs)


def collect_lazy_compute_data_proto(mesh_name: str, worker_group, *args, **kwargs):
    """nd collect for mesh `mesh_name` (after its dispatch), asking which workers answer on first use."""
    if mesh_name not in worker_group._collect_info:
        worker_group._collect_info[mesh_name] = worker_group._query_collect_info(mesh_name)
    return collect_nd_compute_dataproto(worker_group._collect_info[mesh_name], worker_group, *args, **kwargs)


def make_nd_compute_dataproto_dispatch_fn(mesh_name: str) -> dict:
    """A `register(dispatch_mode=...)` value: DataProto arguments split by the workers' data-parallel rank in
    mesh `mesh_name` (each worker registered with `_register_dispatch_collect_info`), outputs gathered from one
    worker per rank."""
    return {"dispatch_fn": partial(dispatch_lazy_compute_data_proto, mesh_name),
            "collect_fn": partial(collect_lazy_compute_data_proto, mesh_name)}


DISPATCH_MODE_FN_REGISTRY = {
    Dispatch.RANK_ZERO: {"dispatch_fn": dispatch_all_to_all, "collect_fn": collect_all_to_all},
    Dispatch.ONE_TO_ALL: {"dispatch_fn": dispatch_one_to_all, "collect_fn": collect_all_to_all},
    Dispatch.ALL_TO_ALL: {"dispatch_fn": dispatch_all_to_all, "collect_fn": collect_all_to_all},
    Dispatch.DP_COMPUTE: {"dispatch_fn": dispatch_dp_compute, "collect_fn": collect_dp_compute},
    Dispatch.DP_COMPUTE_PROTO: {"dispatch_fn": dispatch_dp_compute_data_proto, "collect_fn": collect_dp_compute_data_proto},
    Dispatch.DP_COMPUTE_PROTO_WITH_FUNC: {
        "dispatch_fn": dispatch_dp_compute_data_proto_with_func,
        "collect_fn": collect_dp_compute_data_proto,
    },
    Dispatch.DP_COMPUTE_METRIC: {"dispatch_fn": dispatch_dp_compute_data_proto, "collect_fn": collect_dp_compute},
}


def get_predefined_dispatch_fn(dispatch_mode: Dispatch) -> dict:
    return DISPATCH_MODE_FN_REGISTRY[dispatch_mode]


def get_dispatch_fns(dispatch_mode) -> tuple:
    """(dispatch_fn, collect_fn) for a Dispatch member or a {"dispatch_fn", "collect_fn"} dict."""
    fns = DISPATCH_MODE_FN_REGISTRY[dispatch_mode] if isinstance(dispatch_mode, Dispatch) else dispatch_mode
    return fns["dispatch_fn"], fns["collect_fn"]


# ---- the decorator -------------------------------------------------------------------------------


def _materialize_futures(args, kwargs):
    args = tuple(a.get() if isinstance(a, DataProtoFuture) else a for a in args)
    kwargs = {k: v.get() if isinstance(v, DataProtoFuture) else v for k, v in kwargs.items()}
    return args, kwargs


def register(dispatch_mode=Dispatch.ALL_TO_ALL, execute_mode=Execute.ALL, blocking=True, materialize_futures=True):
    """Expose a Worker method on its worker group.

    dispatch_mode: a `Dispatch` member or {"dispatch_fn": f(group, *a, **kw) -> (a, kw), "collect_fn": f(group, outs)}.
    execute_mode: `Execute.ALL` or `Execute.RANK_ZERO` (implied by `Dispatch.RANK_ZERO`).
    blocking: False returns futures (a `DataProtoFuture` for DataProto outputs) instead of waiting.
    materialize_futures: inside the worker, resolve `DataProtoFuture` arguments before the method runs.
    """
    if isinstance(dispatch_mode, dict):
        missing = {"dispatch_fn", "collect_fn"} - set(dispatch_mode)
        if missing:
            raise ValueError(f"a custom dispatch_mode dict needs the keys {sorted(missing)}")
    elif not isinstance(dispatch_mode, Dispatch):
        raise TypeError(f"dispatch_mode must be a Dispatch or a dict, got {dispatch_mode!r}")
    if not isinstance(execute_mode, Execute):
        raise TypeError(f"execute_mode must be an Execute, got {execute_mode!r}")
    if dispatch_mode is Dispatch.RANK_ZERO:
        execute_mode = Execute.RANK_ZERO

    def decorator(func):
        if inspect.iscoroutinefunction(func):
            # An async method stays async, so Ray runs the actor's event loop and awaits it (a plain
            # wrapper would hand Ray an un-awaited coroutine, which it then fails to pickle).
            @functools.wraps(func)
            async def inner(*args, **kwargs):
                if materialize_futures:
                    args, kwargs = _materialize_futures(args, kwargs)
                return await func(*args, **kwargs)
        else:
            @functools.wraps(func)
            def inner(*args, **kwargs):
                if materialize_futures:
                    args, kwargs = _materialize_futures(args, kwargs)
                return func(*args, **kwargs)

        setattr(inner, MAGIC_ATTR, {"dispatch_mode": dispatch_mode, "execute_mode": execute_mode, "blocking": blocking})
        return inner

    return decorator
