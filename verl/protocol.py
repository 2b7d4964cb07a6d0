"""`DataProto`: the batch object the controller and the workers pass to each other.

A DataProto holds three things:

* `batch` -- a `TensorBatch`: tensors that share their first (batch) dimension;
* `non_tensor_batch` -- numpy arrays (usually dtype=object) with the same first dimension;
* `meta_info` -- a plain dict for everything that is not per-sample (temperature, metrics, ...).

Upstream keeps `batch` in a `tensordict.TensorDict`. Recent tensordict releases need a recent torch, and
this fork keeps a low torch floor for older cards, so `TensorBatch` implements the part of the TensorDict
API that verl code uses (`batch_size`, key access, `select`, `to`, slicing, `torch.cat`).
"""

from __future__ import annotations

import copy
import logging
import os
import pickle
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

import numpy as np
import torch

__all__ = [
    "TensorBatch",
    "DataProto",
    "DataProtoError",
    "DataProtoItem",
    "DataProtoFuture",
    "DataProtoConfig",
    "pad_dataproto_to_divisor",
    "unpad_dataproto",
    "union_tensor_dict",
    "union_numpy_dict",
    "collate_fn",
    "fold_batch_dim",
    "unfold_batch_dim",
    "all_gather_data_proto",
    "serialize_single_tensor",
    "deserialize_single_tensor",
    "serialize_tensordict",
    "deserialize_tensordict",
]

DEFAULT_RAY_GET_TIMEOUT_S = 3600.0


def ray_get_timeout() -> float:
    """Seconds the driver waits for a worker-group call (env VERL_RAY_GET_TIMEOUT, default one hour)."""
    return float(os.environ.get("VERL_RAY_GET_TIMEOUT", DEFAULT_RAY_GET_TIMEOUT_S))


logger = logging.getLogger(__name__)

# Key the dispatcher uses to tell the collector how many padded rows to drop (see single_controller).
_padding_size_key = "_padding_size_key_x123d"

_Index = (int, np.integer, slice, list, np.ndarray, torch.Tensor, range)


class DataProtoError(ValueError, AssertionError):
    """Inconsistent batch data. Also an AssertionError: upstream checks these with asserts, and callers
    written for it catch that."""


def _as_size(batch_size) -> torch.Size:
    if isinstance(batch_size, (int, np.integer)):
        return torch.Size([int(batch_size)])
    return torch.Size(batch_size)


def _normalize_index(item):
    """An int, a slice, or a 1-D long / bool tensor selecting rows."""
    if isinstance(item, (int, np.integer)):
        return int(item)
    if isinstance(item, slice):
        return item
    if isinstance(item, (range, list, np.ndarray)):
        item = torch.as_tensor(np.asarray(list(item) if isinstance(item, range) else item))
    if item.ndim == 0:
        return int(item)
    return item if item.dtype == torch.bool else item.long()


def _split_sizes(total: int, chunks: int) -> list[int]:
    """Sizes of `chunks` consecutive parts of `total` rows, differing by at most one (numpy array_split)."""
    base, extra = divmod(total, chunks)
    return [base + 1 if i < extra else base for i in range(chunks)]


class TensorBatch:
    """A mapping of name -> tensor whose tensors share the leading `batch_size` dimensions.

    Integer, slice and index-array access apply to the batch dimension of every tensor at once;
    string access returns one tensor. `len()` is the batch size (as for a TensorDict), not the key count.
    """

    def __init__(self, source: Optional[dict] = None, batch_size=None, device=None):
        tensors = dict(source or {})
        if batch_size is None:
            first = next(iter(tensors.values()), None)
            batch_size = first.shape[:1] if first is not None else ()
        self._batch_size = _as_size(batch_size)
        self._tensors: dict[str, torch.Tensor] = {}
        for key, value in tensors.items():
            self[key] = value if device is None else value.to(device)

    # ---- shape and device ------------------------------------------------------------------
    @property
    def batch_size(self) -> torch.Size:
        return self._batch_size

    @property
    def device(self) -> Optional[torch.device]:
        """The device all tensors live on, or None when they are spread or there are none."""
        devices = {t.device for t in self._tensors.values()}
        return devices.pop() if len(devices) == 1 else None

    def __len__(self) -> int:
        return self._batch_size[0] if len(self._batch_size) else 0

    # ---- mapping interface -----------------------------------------------------------------
    def keys(self):
        return self._tensors.keys()

    def values(self):
        return self._tensors.values()

    def items(self):
        return self._tensors.items()

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __contains__(self, key) -> bool:
        return key in self._tensors

    def get(self, key: str, default=None):
        return self._tensors.get(key, default)

    def __getitem__(self, item):
        if isinstance(item, str):
            return self._tensors[item]
        if not isinstance(item, _Index):
            raise TypeError(f"TensorBatch cannot be indexed with {type(item).__name__}")
        index = _normalize_index(item)
        if isinstance(index, int):
            size = self._batch_size[1:]
        elif isinstance(index, slice):
            size = torch.Size([len(range(self._batch_size[0])[index])]) + self._batch_size[1:]
        else:
            rows = int(index.sum()) if index.dtype == torch.bool else index.numel()
            size = torch.Size([rows]) + self._batch_size[1:]
        on = (lambda t: index.to(t.device)) if isinstance(index, torch.Tensor) else (lambda t: index)
        return TensorBatch({k: t[on(t)] for k, t in self.items()}, batch_size=size)

    def __setitem__(self, key: str, value: torch.Tensor):
        if not isinstance(key, str):
            raise TypeError(f"TensorBatch keys are strings; assign rows through DataProto instead (got {key!r})")
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"TensorBatch['{key}'] must be a torch.Tensor, got {type(value).__name__}")
        lead = value.shape[: len(self._batch_size)]
        if lead != self._batch_size:
            raise ValueError(
                f"tensor '{key}' has leading shape {tuple(lead)}, batch size is {tuple(self._batch_size)}"
            )
        self._tensors[key] = value

    def __delitem__(self, key: str):
        del self._tensors[key]

    def pop(self, key: str, *default):
        return self._tensors.pop(key, *default)

    def update(self, other) -> "TensorBatch":
        for key, value in dict(other.items()).items():
            self[key] = value
        return self

    def set(self, key: str, value: torch.Tensor) -> "TensorBatch":
        self[key] = value
        return self

    def rename_key_(self, old_keys, new_keys) -> "TensorBatch":
        old_keys = (old_keys,) if isinstance(old_keys, str) else tuple(old_keys)
        new_keys = (new_keys,) if isinstance(new_keys, str) else tuple(new_keys)
        for old, new in zip(old_keys, new_keys, strict=True):
            self._tensors[new] = self._tensors.pop(old)
        return self

    # ---- whole-batch operations ------------------------------------------------------------
    def _with(self, tensors: dict, batch_size=None) -> "TensorBatch":
        return TensorBatch(tensors, batch_size=self._batch_size if batch_size is None else batch_size)

    def select(self, *keys: str, strict: bool = True) -> "TensorBatch":
        if strict:
            missing = [k for k in keys if k not in self._tensors]
            if missing:
                raise KeyError(f"keys {missing} are not in the batch; it has {sorted(self._tensors)}")
        return self._with({k: self._tensors[k] for k in keys if k in self._tensors})

    def exclude(self, *keys: str) -> "TensorBatch":
        return self._with({k: v for k, v in self.items() if k not in keys})

    def to(self, device) -> "TensorBatch":
        return self._with({k: v.to(device) for k, v in self.items()})

    def cpu(self) -> "TensorBatch":
        return self.to("cpu")

    def contiguous(self) -> "TensorBatch":
        return self._with({k: v.contiguous() for k, v in self.items()})

    def clone(self) -> "TensorBatch":
        return self._with({k: v.clone() for k, v in self.items()})

    def chunk(self, chunks: int, dim: int = 0) -> list["TensorBatch"]:
        """`chunks` parts along the batch dimension, sizes differing by at most one."""
        if dim != 0:
            raise ValueError("TensorBatch only splits along the batch dimension (dim=0)")
        return self.split(_split_sizes(len(self), chunks))

    def split(self, split_size, dim: int = 0) -> list["TensorBatch"]:
        """Parts of `split_size` rows (the last may be shorter), or of the listed sizes."""
        if dim != 0:
            raise ValueError("TensorBatch only splits along the batch dimension (dim=0)")
        sizes = split_size if isinstance(split_size, (list, tuple)) else None
        if sizes is None:
            sizes = [min(split_size, len(self) - s) for s in range(0, len(self), split_size)]
        out, start = [], 0
        for size in sizes:
            out.append(self[start : start + size])
            start += size
        return out

    @staticmethod
    def cat(batches: list["TensorBatch"], dim: int = 0) -> "TensorBatch":
        if dim != 0:
            raise ValueError("TensorBatch only concatenates along the batch dimension (dim=0)")
        keys = list(batches[0].keys())
        for b in batches[1:]:
            if set(b.keys()) != set(keys):
                raise ValueError(f"cannot concatenate batches with different keys: {sorted(keys)} vs {sorted(b.keys())}")
        size = torch.Size([sum(len(b) for b in batches)]) + batches[0].batch_size[1:]
        return TensorBatch({k: torch.cat([b[k] for b in batches], dim=0) for k in keys}, batch_size=size)

    @staticmethod
    def stack(batches: list["TensorBatch"], dim: int = 0) -> "TensorBatch":
        if dim != 0:
            raise ValueError("TensorBatch only stacks along a new leading dimension (dim=0)")
        size = torch.Size([len(batches)]) + batches[0].batch_size
        return TensorBatch({k: torch.stack([b[k] for b in batches]) for k in batches[0].keys()}, batch_size=size)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        # lets code written for TensorDict keep calling torch.cat / torch.stack on batches
        kwargs = kwargs or {}
        if func is torch.cat:
            return cls.cat(*args, **kwargs)
        if func is torch.stack:
            return cls.stack(*args, **kwargs)
        return NotImplemented

    def to_dict(self) -> dict[str, torch.Tensor]:
        return dict(self._tensors)

    def __eq__(self, other):
        if not isinstance(other, TensorBatch):
            return NotImplemented
        return (
            self.batch_size == other.batch_size
            and self.keys() == other.keys()
            and all(torch.equal(v, other[k]) for k, v in self.items())
        )

    __hash__ = None

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}: {tuple(v.shape)} {v.dtype}" for k, v in self.items())
        return f"TensorBatch(batch_size={tuple(self._batch_size)}, {{{fields}}})"

    # ---- pickling ----------------------------------------------------------------------------
    def __getstate__(self):
        return {"batch_size": tuple(self._batch_size), "tensors": {k: _pack_tensor(v) for k, v in self.items()}}

    def __setstate__(self, state):
        self._batch_size = torch.Size(state["batch_size"])
        self._tensors = {k: _unpack_tensor(v) for k, v in state["tensors"].items()}


def _pack_tensor(t: torch.Tensor):
    """Plain CPU tensors travel as a raw byte array (zero-copy for Ray's pickle-5 buffers).

    A slice of a larger tensor is copied first: pickling the view would ship the whole storage.
    Other tensors (accelerator, sparse, ...) keep torch's own pickling and so keep their device.
    """
    if t.device.type != "cpu" or t.layout != torch.strided:
        if t.layout == torch.strided and t.untyped_storage().nbytes() > t.numel() * t.element_size():
            t = t.clone()
        return t
    flat = t.detach().contiguous().reshape(-1)
    return ("raw", str(flat.dtype).removeprefix("torch."), tuple(t.shape), flat.view(torch.uint8).numpy())


def _unpack_tensor(packed):
    if isinstance(packed, torch.Tensor):
        return packed
    _, dtype, shape, raw = packed
    if not raw.flags.writeable:  # arrays read back from Ray's object store are read-only
        raw = raw.copy()
    return torch.from_numpy(raw).view(getattr(torch, dtype)).reshape(shape)


# ---- dict helpers ------------------------------------------------------------------------------


def _values_equal(a: Any, b: Any, _seen: Optional[set] = None) -> bool:
    """Equality that treats NaN as equal to NaN and compares arrays element by element.

    Object arrays may contain themselves: a pair already being compared further up counts as equal, so two
    arrays of the same circular shape compare equal instead of recursing forever."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        if not (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)) or a.shape != b.shape:
            return False
        if a.dtype != object and b.dtype != object:
            return bool(np.array_equal(a, b, equal_nan=a.dtype.kind in "fc" and b.dtype.kind in "fc"))
        seen = set() if _seen is None else _seen
        pair = (id(a), id(b))
        if pair in seen:
            return True
        seen.add(pair)
        try:
            return all(_values_equal(x, y, seen) for x, y in zip(a.flat, b.flat))
        finally:
            seen.discard(pair)
    if isinstance(a, float) and isinstance(b, float) and np.isnan(a) and np.isnan(b):
        return True
    try:
        return bool(a == b)
    except (ValueError, TypeError):
        return False


def union_tensor_dict(tensor_dict1: Optional[TensorBatch], tensor_dict2: Optional[TensorBatch]):
    """Add tensor_dict2's tensors to tensor_dict1; a shared key must hold equal tensors."""
    if tensor_dict2 is None:
        return tensor_dict1
    if tensor_dict1 is None:
        return tensor_dict2
    if tensor_dict1.batch_size != tensor_dict2.batch_size:
        raise DataProtoError(
            f"Two tensor dict must have identical batch size. Got {tuple(tensor_dict1.batch_size)} and "
            f"{tuple(tensor_dict2.batch_size)} (cannot union batches of different sizes)"
        )
    for key, value in tensor_dict2.items():
        if key in tensor_dict1 and not torch.equal(tensor_dict1[key], value):
            raise DataProtoError(
                f"{key} in tensor_dict1 and tensor_dict2 are not the same object "
                f"(union conflict: batch key '{key}' holds different tensors on the two sides)"
            )
        tensor_dict1[key] = value
    return tensor_dict1


def union_numpy_dict(tensor_dict1: dict[str, np.ndarray], tensor_dict2: dict[str, np.ndarray]) -> dict:
    """Add tensor_dict2's arrays to tensor_dict1; a shared key must hold equal arrays (NaN == NaN)."""
    for key, value in tensor_dict2.items():
        if key in tensor_dict1 and not _values_equal(tensor_dict1[key], value):
            raise DataProtoError(
                f"`{key}` in tensor_dict1 and tensor_dict2 are not the same object. "
                f"(union conflict: non_tensor_batch key '{key}' holds different values on the two sides)"
            )
        tensor_dict1[key] = value
    return tensor_dict1


def _union_meta(meta1: dict, meta2: dict) -> dict:
    for key, value in meta2.items():
        if key in meta1 and not _values_equal(meta1[key], value):
            raise DataProtoError(f"union conflict: meta_info key '{key}' is {meta1[key]!r} on one side, {value!r} on the other")
        meta1[key] = value
    return meta1


def _list_of_dict_to_dict_of_list(dicts: list[dict]) -> dict[str, list]:
    out: dict[str, list] = {}
    for d in dicts:
        for key, value in d.items():
            out.setdefault(key, []).append(value)
    return out


# ---- padding -----------------------------------------------------------------------------------


class _DataProtoConfigMeta(type):
    _auto_padding = False
    auto_padding_key = "_verl_auto_padding"

    @property
    def auto_padding(cls) -> bool:
        """Padding for uneven dispatch, switched on globally here or with VERL_AUTO_PADDING=1."""
        return cls._auto_padding or os.getenv("VERL_AUTO_PADDING", "0").upper() in ("1", "TRUE")

    @auto_padding.setter
    def auto_padding(cls, enabled: bool):
        if not isinstance(enabled, bool):
            raise TypeError(f"DataProtoConfig.auto_padding takes a bool, got {enabled!r}")
        cls._auto_padding = enabled


class DataProtoConfig(metaclass=_DataProtoConfigMeta):
    """Process-wide DataProto switches (upstream's name)."""


def pad_dataproto_to_divisor(data: "DataProto", size_divisor: int) -> tuple["DataProto", int]:
    """Append rows copied from the start of `data` until its length divides by `size_divisor`.

    Returns (padded data, number of rows added); `unpad_dataproto` drops them again.
    """
    if not isinstance(data, DataProto):
        raise TypeError(f"pad_dataproto_to_divisor takes a DataProto, got {type(data).__name__}")
    if size_divisor <= 0:
        raise ValueError(f"size_divisor must be positive, got {size_divisor}")
    remainder = len(data) % size_divisor
    if remainder == 0:
        return data, 0
    pad_size = size_divisor - remainder
    # cycle through the rows so that padding more than len(data) rows works
    pad_idx = np.arange(pad_size) % len(data)
    return DataProto.concat([data, data.select_idxs(pad_idx)]), pad_size


def unpad_dataproto(data: "DataProto", pad_size: int) -> "DataProto":
    """Drop the last `pad_size` rows added by `pad_dataproto_to_divisor`."""
    return data[: len(data) - pad_size] if pad_size else data


def _is_tensordict(value) -> bool:
    """A `tensordict.TensorDict` (told by its type, so tensordict need not be installed)."""
    return any(c.__module__.startswith("tensordict") and c.__name__ == "TensorDict" for c in type(value).__mro__)


def _tensor_batch_from_tensordict(td) -> TensorBatch:
    """The tensors of a TensorDict given as `DataProto.batch` (upstream's batch type) as this verl's TensorBatch."""
    tensors = {key: value for key, value in td.items() if isinstance(value, torch.Tensor)}
    dropped = sorted(set(td.keys()) - set(tensors))
    if dropped:
        raise TypeError(f"DataProto.batch holds tensors only; put {dropped} in non_tensor_batch or meta_info")
    return TensorBatch(tensors, batch_size=td.batch_size, device=td.device)


def fold_batch_dim(data: "DataProto", new_batch_size):
    """Rows grouped into `new_batch_size` groups: every tensor and array (new_batch_size, len // new_batch_size,
    ...), the batch size (new_batch_size,). Consecutive rows share a group (e.g. the n responses of a prompt
    after `repeat(interleave=True)`)."""
    rows = len(data)
    if rows % new_batch_size:
        raise ValueError(f"cannot fold {rows} rows into {new_batch_size} groups")
    batch = None
    if data.batch is not None:
        batch = TensorBatch({k: t.reshape(new_batch_size, -1, *t.shape[1:]) for k, t in data.batch.items()},
                            batch_size=(new_batch_size,))
    non_tensor = {k: np.reshape(v, (new_batch_size, -1, *v.shape[1:])) for k, v in data.non_tensor_batch.items()}
    return type(data)(batch=batch, non_tensor_batch=non_tensor, meta_info=data.meta_info)


def unfold_batch_dim(data: "DataProto", batch_dims=2):
    """Undo `fold_batch_dim`: the first `batch_dims` dimensions of every tensor and array merged into one."""
    def merge(shape):
        return (int(np.prod(shape[:batch_dims])), *shape[batch_dims:])

    batch = None
    if data.batch is not None:
        tensors = {k: t.reshape(merge(t.shape)) for k, t in data.batch.items()}
        batch = TensorBatch(tensors, batch_size=merge(next(iter(data.batch.values())).shape)[:1] if tensors else ())
    non_tensor = {k: np.reshape(v, merge(v.shape)) for k, v in data.non_tensor_batch.items()}
    return type(data)(batch=batch, non_tensor_batch=non_tensor, meta_info=data.meta_info)


def _collective_device(process_group) -> torch.device:
    """Where a collective of `process_group` takes its tensors: the CPU for gloo, the accelerator otherwise."""
    import torch.distributed as dist

    if dist.get_backend(process_group) == "gloo":
        return torch.device("cpu")
    from verl.utils.device import get_device_id, get_device_name

    return torch.device(get_device_name(), get_device_id())


def all_gather_data_proto(data: "DataProto", process_group) -> None:
    """Give `data`, in place, the rows of every rank of `process_group` in rank order (as torch's all_gather
    fills its list): every tensor and non-tensor array; `meta_info` stays this rank's. Ranks may hold
    different row counts (tensors are padded for the collective and cut back).

    Tensors cross on the group's device and return to the device each came from. Every rank must call it
    with the same keys and the same non-batch tensor shapes.
    """
    import torch.distributed as dist

    if not isinstance(data, DataProto):
        raise TypeError(f"all_gather_data_proto takes a DataProto, got {type(data).__name__}")
    world = dist.get_world_size(group=process_group)
    parts: list = [None] * world
    dist.all_gather_object(parts, (len(data), data.non_tensor_batch), group=process_group)
    rows = [n for n, _ in parts]
    if data.batch is not None:
        wire, most = _collective_device(process_group), max(rows)
        gathered = {}
        for key in sorted(data.batch.keys()):  # one order on every rank: collectives pair up by call order
            local = data.batch[key]
            padded = local.new_zeros((most, *local.shape[1:]), device=wire)
            padded[: len(local)] = local.to(wire)
            pieces = [torch.empty_like(padded) for _ in range(world)]
            dist.all_gather(pieces, padded, group=process_group)
            gathered[key] = torch.cat([p[:n] for p, n in zip(pieces, rows)]).to(local.device)
        data.batch = TensorBatch(gathered, batch_size=(sum(rows), *data.batch.batch_size[1:]))
    data.non_tensor_batch = {k: np.concatenate([nt[k] for _, nt in parts]) for k in data.non_tensor_batch}


def serialize_single_tensor(obj: torch.Tensor) -> tuple[str, tuple[int, ...], Any]:
    """(dtype name, shape, the bytes as a uint8 numpy array): a CPU tensor in a form that pickles without torch."""
    raw = obj.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
    return str(obj.dtype).removeprefix("torch."), obj.shape, raw


def deserialize_single_tensor(arr: Any) -> torch.Tensor:
    """The tensor `serialize_single_tensor` encoded (its own writable copy of the bytes)."""
    dtype_name, shape, raw = arr
    dtype = getattr(torch, dtype_name)
    assert isinstance(dtype, torch.dtype), f"{dtype_name} is not a torch dtype"
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(dtype).view(shape)


def serialize_tensordict(batch) -> tuple[tuple[int, ...], Optional[str], dict[str, tuple]]:
    """(batch size, device name or None, {key: encoded tensor}) for a TensorDict (or TensorBatch) of tensors;
    a nested tensor is encoded as (layout name, [its rows encoded])."""
    items = {}
    for key, value in batch.items():
        if value.is_nested:
            items[key] = (str(value.layout).removeprefix("torch."), [serialize_single_tensor(r) for r in value.unbind()])
        else:
            items[key] = serialize_single_tensor(value)
    device = batch.device
    return tuple(batch.batch_size), None if device is None else str(device), items


def deserialize_tensordict(arr: Any):
    """The TensorDict `serialize_tensordict` encoded (needs the optional tensordict package)."""
    from tensordict import TensorDict

    batch_size, device, items = arr
    decoded = {}
    for key, value in items.items():
        if len(value) == 3:
            decoded[key] = deserialize_single_tensor(value)
        elif len(value) == 2:
            layout, rows = value
            decoded[key] = torch.nested.as_nested_tensor([deserialize_single_tensor(r) for r in rows],
                                                         layout=getattr(torch, layout))
        else:
            raise ValueError(f"invalid tensor encoding for {key!r}: expected 2 or 3 fields, got {len(value)}")
    return TensorDict(source=decoded, batch_size=batch_size, device=device)


# ---- DataProto ---------------------------------------------------------------------------------


@dataclass
class DataProtoItem:
    """One row of a DataProto (what `data[i]` returns)."""

    batch: Optional[TensorBatch] = None
    non_tensor_batch: dict = field(default_factory=dict)
    meta_info: dict = field(default_factory=dict)


@dataclass
class DataProto:
    """Tensors, numpy arrays and meta info for one batch of samples; see the module docstring."""

    batch: Optional[TensorBatch] = None
    non_tensor_batch: dict = field(default_factory=dict)
    meta_info: dict = field(default_factory=dict)

    def __post_init__(self):
        if isinstance(self.batch, dict):
            self.batch = TensorBatch(self.batch)
        elif _is_tensordict(self.batch):
            self.batch = _tensor_batch_from_tensordict(self.batch)
        self.non_tensor_batch = {} if self.non_tensor_batch is None else self.non_tensor_batch
        self.meta_info = {} if self.meta_info is None else self.meta_info
        self.check_consistency()

    # ---- construction ------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, tensors=None, non_tensors=None, meta_info=None, num_batch_dims=1, auto_padding=False):
        """Build from {name: tensor} and {name: array-like}; all share the first dimension."""
        tensors = dict(tensors or {})
        non_tensors = {
            k: v if isinstance(v, np.ndarray) else np.array(v, dtype=object) for k, v in (non_tensors or {}).items()
        }
        meta_info = dict(meta_info or {})
        if num_batch_dims != 1 and non_tensors:
            raise DataProtoError("num_batch_dims > 1 is only supported without non_tensors")
        batch = None
        if tensors:
            first_key, first = next(iter(tensors.items()))
            size = first.shape[:num_batch_dims]
            for key, value in tensors.items():
                if value.shape[:num_batch_dims] != size:
                    raise DataProtoError(
                        f"tensors disagree on the batch size: '{first_key}' has {tuple(size)}, "
                        f"'{key}' has {tuple(value.shape[:num_batch_dims])}"
                    )
            batch = TensorBatch(tensors, batch_size=size)
        if auto_padding:
            meta_info[DataProtoConfig.auto_padding_key] = True
        return cls(batch=batch, non_tensor_batch=non_tensors, meta_info=meta_info)

    @classmethod
    def from_single_dict(cls, data: dict, meta_info=None, auto_padding=False):
        """Build from one dict, sorting tensors into `batch` and numpy arrays into `non_tensor_batch`."""
        tensors, non_tensors = {}, {}
        for key, value in data.items():
            if isinstance(value, torch.Tensor):
                tensors[key] = value
            elif isinstance(value, np.ndarray):
                non_tensors[key] = value
            else:
                raise TypeError(f"'{key}' is a {type(value).__name__}; from_single_dict takes tensors or numpy arrays")
        return cls.from_dict(tensors, non_tensors, meta_info=meta_info, auto_padding=auto_padding)

    @classmethod
    def from_tensordict(cls, tensor_dict, meta_info=None, num_batch_dims: int = 1) -> "DataProto":
        """From a `tensordict.TensorDict` (needs tensordict, which is not a dependency): tensors become
        `batch`, per-sample `NonTensorStack` entries `non_tensor_batch`, single `NonTensorData` entries
        `meta_info` (upstream's mapping)."""
        from tensordict import NonTensorData, NonTensorStack

        meta_info = dict(meta_info or {})
        tensors, non_tensors = {}, {}
        for key, value in tensor_dict.items():
            if isinstance(value, torch.Tensor):
                tensors[key] = value
            elif isinstance(value, NonTensorStack):
                non_tensors[key] = np.array([item.data for item in value], dtype=object)
            elif isinstance(value, NonTensorData):
                meta_info[key] = value.data
        if non_tensors and num_batch_dims != 1:
            raise DataProtoError("non-tensor entries need num_batch_dims=1")
        return cls.from_dict(tensors, non_tensors, meta_info=meta_info, num_batch_dims=num_batch_dims)

    def to_tensordict(self):
        """As a `tensordict.TensorDict` (needs tensordict): tensors as they are, each non-tensor column as
        a NonTensorStack, each meta_info entry as NonTensorData."""
        from tensordict import NonTensorData, NonTensorStack, TensorDict

        tensors = dict(self.batch.items()) if self.batch is not None else {}
        clash = set(tensors) & (set(self.non_tensor_batch) | set(self.meta_info))
        if clash:
            raise DataProtoError(f"keys {sorted(clash)} are both tensors and non-tensor data")
        out = TensorDict(tensors, batch_size=[len(self)])
        for key, column in self.non_tensor_batch.items():
            out[key] = NonTensorStack.from_list([NonTensorData(item) for item in column])
        for key, value in self.meta_info.items():
            out[key] = NonTensorData(value)
        return out

    def check_consistency(self):
        """Raise if the batch and the non-tensor arrays disagree on the number of samples."""
        if self.batch is not None and not isinstance(self.batch, TensorBatch):
            raise TypeError(f"DataProto.batch must be a TensorBatch or None, got {type(self.batch).__name__}")
        if self.batch is not None and len(self.batch.batch_size) != 1:
            raise DataProtoError(f"DataProto needs exactly one batch dimension, got {tuple(self.batch.batch_size)}")
        for key, value in self.non_tensor_batch.items():
            if not isinstance(value, np.ndarray):
                raise TypeError(f"non_tensor_batch['{key}'] must be a numpy array, got {type(value).__name__}")
        sizes = {f"non_tensor_batch['{k}']": len(v) for k, v in self.non_tensor_batch.items()}
        if self.batch is not None:
            sizes = {"batch": len(self.batch), **sizes}
        if len(set(sizes.values())) > 1:
            raise DataProtoError(f"DataProto parts disagree on the number of samples: {sizes}")

    # ---- size and access ---------------------------------------------------------------------
    def __len__(self) -> int:
        if self.batch is not None:
            return len(self.batch)
        for value in self.non_tensor_batch.values():
            return len(value)
        return 0

    def __getitem__(self, item):
        """int -> DataProtoItem; slice, index list/array/tensor or boolean mask -> DataProto."""
        if isinstance(item, slice):
            return self.slice(item.start, item.stop, item.step)
        if isinstance(item, (list, np.ndarray, torch.Tensor, range)):
            return self.select_idxs(item)
        if isinstance(item, (int, np.integer)):
            return DataProtoItem(
                batch=self.batch[item] if self.batch is not None else None,
                non_tensor_batch={k: v[item] for k, v in self.non_tensor_batch.items()},
                meta_info=self.meta_info,
            )
        raise TypeError(f"DataProto cannot be indexed with {type(item).__name__}")

    def slice(self, start=None, end=None, step=None) -> "DataProto":
        s = slice(start, end, step)
        return type(self)(
            batch=self.batch[s] if self.batch is not None else None,
            non_tensor_batch={k: v[s] for k, v in self.non_tensor_batch.items()},
            meta_info=self.meta_info,
        )

    def select_idxs(self, idxs) -> "DataProto":
        """Rows at the given indices (or where a boolean mask is True)."""
        if isinstance(idxs, torch.Tensor):
            idxs_np = idxs.detach().cpu().numpy()
        else:
            idxs_np = np.asarray(list(idxs) if isinstance(idxs, range) else idxs)
            if idxs_np.dtype != bool:
                idxs_np = idxs_np.astype(np.int64)
        return type(self)(
            batch=self.batch[idxs_np] if self.batch is not None else None,
            non_tensor_batch={k: v[idxs_np] for k, v in self.non_tensor_batch.items()},
            meta_info=self.meta_info,
        )

    # ---- keys --------------------------------------------------------------------------------
    def select(self, batch_keys=None, non_tensor_batch_keys=None, meta_info_keys=None, deepcopy=False) -> "DataProto":
        """A view with only the named keys (None keeps all); deepcopy copies non-tensor data and meta info."""
        batch = self.batch
        if batch_keys is not None:
            if batch is None:
                raise KeyError(f"batch keys {list(batch_keys)} requested from a DataProto without tensors")
            batch = batch.select(*batch_keys)
        non_tensor = self.non_tensor_batch
        if non_tensor_batch_keys is not None:
            missing = [k for k in non_tensor_batch_keys if k not in non_tensor]
            if missing:
                raise KeyError(f"non_tensor_batch keys {missing} not found; present: {sorted(non_tensor)}")
            non_tensor = {k: non_tensor[k] for k in non_tensor_batch_keys}
        else:
            non_tensor = dict(non_tensor)
        meta = self.meta_info
        if meta_info_keys is not None:
            meta = {k: meta[k] for k in meta_info_keys if k in meta}
        else:
            meta = dict(meta)
        if deepcopy:
            non_tensor, meta = copy.deepcopy(non_tensor), copy.deepcopy(meta)
        return type(self)(batch=batch, non_tensor_batch=non_tensor, meta_info=meta)

    def pop(self, batch_keys=None, non_tensor_batch_keys=None, meta_info_keys=None) -> "DataProto":
        """Remove the named keys from this DataProto and return them as a new one."""
        missing = [k for k in batch_keys or [] if self.batch is None or k not in self.batch]
        missing += [k for k in non_tensor_batch_keys or [] if k not in self.non_tensor_batch]
        missing += [k for k in meta_info_keys or [] if k not in self.meta_info]
        if missing:
            raise KeyError(f"cannot pop {missing}: not in this DataProto")
        tensors = {k: self.batch.pop(k) for k in batch_keys or []}
        non_tensors = {k: self.non_tensor_batch.pop(k) for k in non_tensor_batch_keys or []}
        meta = {k: self.meta_info.pop(k) for k in meta_info_keys or []}
        return type(self).from_dict(tensors, non_tensors, meta_info=meta)

    def rename(self, old_keys=None, new_keys=None) -> "DataProto":
        """Rename batch keys in place."""
        old_keys = [old_keys] if isinstance(old_keys, str) else list(old_keys or [])
        new_keys = [new_keys] if isinstance(new_keys, str) else list(new_keys or [])
        if len(old_keys) != len(new_keys):
            raise DataProtoError(f"rename needs as many new keys as old ones, got {old_keys} -> {new_keys}")
        self.batch.rename_key_(old_keys, new_keys)
        return self

    def union(self, other: "DataProto") -> "DataProto":
        """Merge `other` into this DataProto in place; a key present on both sides must hold equal values."""
        if len(self) != len(other) and self.batch is not None and other.batch is not None:
            raise DataProtoError(f"cannot union DataProtos of {len(self)} and {len(other)} samples")
        self.batch = union_tensor_dict(self.batch, other.batch)
        self.non_tensor_batch = union_numpy_dict(self.non_tensor_batch, other.non_tensor_batch)
        self.meta_info = _union_meta(self.meta_info, other.meta_info)
        self.check_consistency()
        return self

    # ---- splitting and joining ---------------------------------------------------------------
    def is_padding_enabled(self) -> bool:
        return bool(self.meta_info.get(DataProtoConfig.auto_padding_key, False)) or DataProtoConfig.auto_padding

    def padding(self, padding_size: int, padding_candidate: str = ""):
        """Append `padding_size` copies of the first ("first") or last row, in place."""
        if padding_size == 0:
            return
        row = self.select_idxs([0 if padding_candidate == "first" else len(self) - 1])
        padded = DataProto.concat([self, row.repeat(padding_size)])
        self.batch, self.non_tensor_batch = padded.batch, padded.non_tensor_batch

    def chunk(self, chunks: int) -> list["DataProto"]:
        """`chunks` equal parts along the batch; each keeps the meta info.

        The size must divide evenly unless padding is enabled, when parts may differ by one row.
        """
        if chunks <= 0:
            raise DataProtoError(f"chunks must be positive, got {chunks}")
        if len(self) % chunks != 0 and not self.is_padding_enabled():
            raise DataProtoError(
                f"cannot chunk a DataProto of {len(self)} samples into {chunks} equal parts: "
                f"make the batch size a multiple of {chunks} or pad it (pad_dataproto_to_divisor)"
            )
        sizes = _split_sizes(len(self), chunks)
        bounds = np.cumsum([0] + sizes)
        return [self.slice(int(bounds[i]), int(bounds[i + 1])) for i in range(chunks)]

    def split(self, split_size: int) -> list["DataProto"]:
        """Consecutive parts of `split_size` samples; the last may be shorter."""
        if split_size <= 0:
            raise DataProtoError(f"split_size must be positive, got {split_size}")
        return [self.slice(i, i + split_size) for i in range(0, len(self), split_size)]

    @staticmethod
    def concat(data: list["DataProto"]) -> "DataProto":
        """Join along the batch. meta_info must agree, except `metrics`.

        Each part's `metrics` (a dict, or a list of dicts) are gathered into one dict of lists,
        one entry per contributing dict -- e.g. per worker: {"actor/pg_loss": [w0_value, w1_value]}.
        """
        if not data:
            raise DataProtoError("DataProto.concat needs at least one DataProto")
        with_batch = [d.batch is not None for d in data]
        if any(with_batch) and not all(with_batch):
            raise DataProtoError("cannot concat DataProtos where some have tensors and some have none")
        batch = TensorBatch.cat([d.batch for d in data]) if all(with_batch) else None

        keys = set(data[0].non_tensor_batch)
        for d in data[1:]:
            if set(d.non_tensor_batch) != keys:
                raise DataProtoError(
                    f"cannot concat: non_tensor_batch keys differ ({sorted(keys)} vs {sorted(d.non_tensor_batch)})"
                )
        non_tensor = {k: np.concatenate([d.non_tensor_batch[k] for d in data], axis=0) for k in keys}

        meta: dict = {}
        metrics: list[dict] = []
        for d in data:
            for key, value in d.meta_info.items():
                if key == "metrics":
                    if isinstance(value, list):
                        metrics.extend(value)
                    elif value is not None:
                        metrics.append(value)
                elif key in meta and not _values_equal(meta[key], value):
                    raise DataProtoError(
                        f"Conflicting values for meta_info key '{key}': meta_info['{key}'] differs between parts "
                        f"({meta[key]!r} vs {value!r})"
                    )
                else:
                    meta[key] = value
        if metrics:
            meta["metrics"] = _list_of_dict_to_dict_of_list(metrics)
        return type(data[0])(batch=batch, non_tensor_batch=non_tensor, meta_info=meta)

    def reorder(self, indices) -> None:
        """Permute the rows in place (e.g. after sequence-length balancing)."""
        reordered = self.select_idxs(indices)
        self.batch, self.non_tensor_batch = reordered.batch, reordered.non_tensor_batch

    def repeat(self, repeat_times: int = 2, interleave: bool = True) -> "DataProto":
        """Each row `repeat_times` times: interleaved (a a b b) or the whole batch tiled (a b a b)."""
        n = len(self)
        rows = np.repeat(np.arange(n), repeat_times) if interleave else np.tile(np.arange(n), repeat_times)
        return self.select_idxs(rows)

    def unfold_column_chunks(self, n_split: int, split_keys: Optional[list[str]] = None) -> "DataProto":
        """Each row becomes `n_split` rows: the columns named in `split_keys` are cut along their second
        dimension into `n_split` pieces (one per new row), every other column is repeated."""
        split_keys = set(split_keys or ())

        def unfold(value):
            return value.reshape(value.shape[0] * n_split, value.shape[1] // n_split, *value.shape[2:])

        batch = None
        if self.batch is not None:
            batch = TensorBatch(
                {k: unfold(t) if k in split_keys else torch.repeat_interleave(t, n_split, dim=0)
                 for k, t in self.batch.items()},
                batch_size=(len(self) * n_split,),
            )
        non_tensor = {k: unfold(v) if k in split_keys else np.repeat(v, n_split, axis=0)
                      for k, v in self.non_tensor_batch.items()}
        return type(self)(batch=batch, non_tensor_batch=non_tensor, meta_info=self.meta_info)

    def sample_level_repeat(self, repeat_times) -> "DataProto":
        """Row i repeated repeat_times[i] times, in order."""
        counts = np.asarray(repeat_times.tolist() if isinstance(repeat_times, torch.Tensor) else repeat_times)
        return self.select_idxs(np.repeat(np.arange(len(self)), counts))

    def make_iterator(self, mini_batch_size: int, epochs: int, seed=None, dataloader_kwargs=None):
        """Yield shuffled-or-not mini-batches (a torch DataLoader over the rows) for `epochs` passes."""
        if len(self) % mini_batch_size != 0:
            raise DataProtoError(f"{len(self)} samples do not split into mini-batches of {mini_batch_size}")
        generator = torch.Generator().manual_seed(seed) if seed is not None else None
        loader = torch.utils.data.DataLoader(
            self, batch_size=mini_batch_size, collate_fn=collate_fn, generator=generator, **(dataloader_kwargs or {})
        )
        for _ in range(epochs):
            for mini_batch in loader:
                mini_batch.meta_info = self.meta_info
                yield mini_batch

    # ---- device and I/O ----------------------------------------------------------------------
    def to(self, device) -> "DataProto":
        """Move the tensors to `device` (in place; returns self, as upstream)."""
        if self.batch is not None:
            self.batch = self.batch.to(device)
        return self

    def __getstate__(self):
        return {"batch": self.batch, "non_tensor_batch": self.non_tensor_batch, "meta_info": self.meta_info}

    def __setstate__(self, state):
        self.batch = state["batch"]
        self.non_tensor_batch = state["non_tensor_batch"]
        self.meta_info = state["meta_info"]

    def save_to_disk(self, filepath):
        with open(filepath, "wb") as f:
            pickle.dump(self, f)

    @staticmethod
    def load_from_disk(filepath) -> "DataProto":
        with open(filepath, "rb") as f:
            return pickle.load(f)

    def nbytes(self) -> tuple[int, int]:
        """(bytes held by tensors, bytes held by non-tensor arrays)."""
        tensors = sum(t.numel() * t.element_size() for t in self.batch.values()) if self.batch is not None else 0
        return tensors, sum(a.nbytes for a in self.non_tensor_batch.values())

    def print_size(self, prefix=""):
        tensors, arrays = self.nbytes()
        message = f"size of tensors: {tensors / 1024**3:.4f} GB, size of non_tensor_batch: {arrays / 1024**3:.4f} GB"
        print(f"{prefix}, {message}" if prefix else message)


def collate_fn(items: list[DataProtoItem]) -> DataProto:
    """Stack DataProtoItems back into a DataProto (the DataLoader collate used by make_iterator)."""
    batch = TensorBatch.stack([it.batch for it in items]) if items[0].batch is not None else None
    non_tensor = _list_of_dict_to_dict_of_list([it.non_tensor_batch for it in items])
    return DataProto(batch=batch, non_tensor_batch={k: np.array(v, dtype=object) for k, v in non_tensor.items()})


def concat_batches(parts: list):
    """Workers' outputs joined in order: DataProtos with `DataProto.concat`, TensorDicts (upstream's newer
    workers return those) with `tensordict_utils.concat_tensordict`."""
    if parts and all(_is_tensordict(p) for p in parts):
        from verl.utils.tensordict_utils import concat_tensordict

        return concat_tensordict(parts)
    return DataProto.concat(parts)


def chunk_batch(data, chunks: int) -> list:
    """A DataProto or TensorDict in `chunks` equal parts (TensorDicts through `tensordict_utils.chunk_tensordict`,
    which also splits jagged tensors)."""
    if _is_tensordict(data):
        from verl.utils.tensordict_utils import chunk_tensordict

        return chunk_tensordict(data, chunks)
    return data.chunk(chunks)


@dataclass
class DataProtoFuture:
    """A DataProto still being computed by a worker group (`register(..., blocking=False)`).

    `collect_fn` joins the per-worker results; `dispatch_fn`, when set, then picks this receiver's part.
    Passing it to another group's method defers the `ray.get` to the receiving workers.
    """

    collect_fn: Callable
    futures: list
    dispatch_fn: Optional[Callable] = None
    timeout_s: Optional[float] = None  # None: VERL_RAY_GET_TIMEOUT or its default

    @staticmethod
    def concat(data: list) -> "DataProtoFuture":
        return DataProtoFuture(collect_fn=concat_batches, futures=data)

    def chunk(self, chunks: int) -> list["DataProtoFuture"]:
        return [
            DataProtoFuture(self.collect_fn, self.futures, _ChunkPicker(i, chunks), self.timeout_s)
            for i in range(chunks)
        ]

    def get(self) -> DataProto:
        import ray

        timeout = self.timeout_s if self.timeout_s is not None else ray_get_timeout()
        output = self.collect_fn(ray.get(self.futures, timeout=timeout))
        return self.dispatch_fn(output) if self.dispatch_fn is not None else output


@dataclass
class _ChunkPicker:
    """Picklable `data.chunk(chunks)[index]` (a lambda would not survive the trip to a worker)."""

    index: int
    chunks: int

    def __call__(self, data: DataProto) -> DataProto:
        return chunk_batch(data, self.chunks)[self.index]
