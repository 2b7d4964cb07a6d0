"""Helpers for batches kept in a `tensordict.TensorDict` (upstream's `verl.utils.tensordict_utils`).

Upstream's newer worker code passes raw TensorDicts instead of DataProto: tensors (jagged nested tensors for
variable-length rows) share the batch dimension, per-row Python objects are a `NonTensorStack`, batch-wide values
a `NonTensorData`. This verl's own workers use DataProto; these helpers serve custom code and the dispatch of
TensorDict arguments. They need the optional `tensordict` package (`pip install verl[tensordict]`): without it,
importing this module raises an ImportError saying so.
"""

from __future__ import annotations

import logging
from typing import Any, Iterable

import numpy as np
import torch

try:
    import tensordict
    from tensordict import TensorDict
    from tensordict.tensorclass import NonTensorData, NonTensorStack
except ImportError as exc:  # the base install does not carry tensordict (its newer releases raise the torch floor)
    raise ImportError(
        "verl.utils.tensordict_utils needs the optional tensordict package: pip install 'verl[tensordict]'"
    ) from exc

logger = logging.getLogger(__name__)

__all__ = [
    "assign_non_tensor_data",
    "assign_non_tensor_stack",
    "assign_non_tensor",
    "unwrap_non_tensor_data",
    "get_non_tensor_data",
    "nested_tensor_from_tensor_list",
    "concat_nested_tensors",
    "concat_tensordict_with_none_bsz",
    "concat_tensordict",
    "chunk_tensordict",
    "get_tensordict",
    "index_select_tensor_dict",
    "union_tensor_dict",
    "make_iterator",
    "assert_tensordict_eq",
    "get",
    "get_keys",
    "pop",
    "pop_keys",
    "pad_to_divisor",
    "unpad",
    "contiguous",
    "maybe_fix_3d_position_ids",
    "list_of_dict_to_tensordict",
]


def _require_td(value) -> None:
    assert isinstance(value, TensorDict), f"expected a TensorDict, got {type(value).__name__}"


def _stack_of(items) -> NonTensorStack:
    """One NonTensorData per row, so nested lists and dicts stay whole objects instead of being stacked."""
    return NonTensorStack.from_list([NonTensorData(item) for item in items])


def _is_nested(value) -> bool:
    return isinstance(value, torch.Tensor) and value.is_nested


def _ragged_dim(nested: torch.Tensor) -> int:
    return getattr(nested, "_ragged_idx", nested.dim() - 1)


def _plain(value):
    """A stored entry as plain Python: tensors unchanged, a NonTensorStack as a list, NonTensorData unwrapped."""
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, NonTensorStack):
        return value.tolist()
    assert isinstance(value, NonTensorData), f"unexpected TensorDict entry {type(value).__name__}"
    return value.data


# ---- non-tensor entries --------------------------------------------------------------------------------------

def assign_non_tensor_data(tensor_dict: TensorDict, key, val):
    """Store one batch-wide value under `key`."""
    _require_td(tensor_dict)
    tensor_dict[key] = NonTensorData(val)


def assign_non_tensor_stack(tensor_dict: TensorDict, key, val: list):
    """Store one object per row (lists, dicts, nested lists of dicts) under `key`."""
    _require_td(tensor_dict)
    tensor_dict[key] = _stack_of(val)


def assign_non_tensor(tensor_dict: TensorDict, **kwargs) -> TensorDict:
    """Store each keyword: a list as per-row objects, a wrapped value as it is, anything else batch-wide."""
    _require_td(tensor_dict)
    for key, val in kwargs.items():
        if isinstance(val, (NonTensorData, NonTensorStack)):
            tensor_dict[key] = val
        elif isinstance(val, list):
            assign_non_tensor_stack(tensor_dict, key, val)
        else:
            assign_non_tensor_data(tensor_dict, key, val)
    return tensor_dict


def unwrap_non_tensor_data(data):
    return data.data if isinstance(data, NonTensorData) else data


def get_non_tensor_data(data: TensorDict, key: str, default):
    return unwrap_non_tensor_data(data.get(key, default))


# ---- nested (jagged) tensors ---------------------------------------------------------------------------------

def nested_tensor_from_tensor_list(tensors: list[torch.Tensor], ragged_idx: int | None = None) -> torch.Tensor:
    """A jagged nested tensor whose rows are `tensors`; they differ in size only along row dimension
    `ragged_idx - 1` (`ragged_idx` counts the batch dimension; default: the last dimension)."""
    assert len(tensors) > 0, "nested_tensor_from_tensor_list needs at least one tensor"
    row_dims = tensors[0].dim()
    ragged_idx = row_dims if ragged_idx is None else ragged_idx
    assert 1 <= ragged_idx <= row_dims, f"ragged_idx must lie in [1, {row_dims}], got {ragged_idx}"
    if row_dims == 1:
        return torch.nested.as_nested_tensor(list(tensors), layout=torch.jagged)
    # the jagged layout keeps rows concatenated along their ragged dimension plus row offsets
    along = ragged_idx - 1
    values = torch.cat(list(tensors), dim=along)
    lengths = torch.tensor([t.shape[along] for t in tensors], dtype=torch.long, device=values.device)
    offsets = torch.cat([lengths.new_zeros(1), torch.cumsum(lengths, dim=0)])
    nested = torch.nested.nested_tensor_from_jagged(values=values, offsets=offsets)
    nested._ragged_idx = ragged_idx
    return nested


def concat_nested_tensors(tensors: list[torch.Tensor]) -> torch.Tensor:
    """Rows of several contiguous jagged tensors (2 or more dims) as one jagged tensor."""
    rows = []
    for t in tensors:
        assert t.is_nested and t.is_contiguous(), "concat_nested_tensors takes contiguous nested tensors"
        assert t.dim() >= 2, f"nested tensors must have 2 or more dimensions, got shape {t.shape}"
        rows.extend(t.unbind(0))
    return nested_tensor_from_tensor_list(rows, ragged_idx=_ragged_dim(tensors[0]))


def _split_nested(nested: torch.Tensor, sizes: list[int]) -> list[torch.Tensor]:
    """Consecutive groups of rows of a jagged tensor, `sizes[i]` rows in group i."""
    ragged = _ragged_dim(nested)
    try:
        rows = list(nested.unbind(0))
    except RuntimeError:
        # unbind fails on some 3-d jagged tensors whose ragged dimension is not the last (pytorch#153238):
        # rebuild each row from the padded form and the row lengths
        padded = nested.to_padded_tensor(0)
        lengths = nested.offsets().diff().tolist()
        along = ragged - 1
        rows = [padded[i].narrow(along, 0, n) for i, n in enumerate(lengths)]
    groups, start = [], 0
    for size in sizes:
        groups.append(nested_tensor_from_tensor_list(rows[start:start + size], ragged_idx=ragged))
        start += size
    return groups


# ---- whole TensorDicts ---------------------------------------------------------------------------------------

def concat_tensordict_with_none_bsz(data: list[TensorDict]) -> TensorDict:
    """TensorDicts with no batch dimension hold only batch-wide values: the first one stands for all."""
    for td in data:
        assert len(td.batch_size) == 0, "concat_tensordict_with_none_bsz takes TensorDicts with batch_size []"
    return data[0]


def concat_tensordict(data: list[TensorDict]) -> TensorDict:
    """Rows of several TensorDicts with the same keys, in order; jagged tensors are joined row by row."""
    assert len(data) > 0, "concat_tensordict needs at least one TensorDict"
    nested_keys = {k for k, v in data[0].items() if _is_nested(v)}
    if not nested_keys:
        if len(data[0].batch_size) == 0:
            return concat_tensordict_with_none_bsz(data)
        return TensorDict.cat(data, dim=0)
    rest = []
    for td in data:
        assert {k for k, v in td.items() if _is_nested(v)} == nested_keys, (
            "all TensorDicts must hold the same nested tensors"
        )
        rest.append(TensorDict({k: v for k, v in td.items() if k not in nested_keys}, batch_size=td.batch_size,
                               device=td.device))
    out = TensorDict.cat(rest, dim=0)
    for key in nested_keys:
        out[key] = concat_nested_tensors([td[key] for td in data])
    return out


def chunk_tensordict(td: TensorDict, chunks: int) -> list[TensorDict]:
    """`chunks` equal parts along the batch (its length must divide); TensorDict.chunk cannot split jagged
    tensors, so those are split here."""
    assert isinstance(td, TensorDict) and len(td) % chunks == 0, (
        f"expecting a TensorDict whose length divides by {chunks}, got length {len(td)}"
    )
    size = len(td) // chunks
    nested_keys = [k for k, v in td.items() if _is_nested(v)]
    rest = TensorDict({k: v for k, v in td.items() if k not in nested_keys}, batch_size=td.batch_size,
                      device=td.device)
    parts = list(rest.chunk(chunks=chunks))
    for key in nested_keys:
        for part, group in zip(parts, _split_nested(td[key], [size] * chunks), strict=True):
            part[key] = group
    return parts


def get_tensordict(tensor_dict: dict[str, torch.Tensor | list], non_tensor_dict: dict = None) -> TensorDict:
    """A TensorDict from per-row entries (tensors, jagged tensors, lists or arrays of Python objects, which become
    NonTensorStacks) and batch-wide `non_tensor_dict` values (NonTensorData). Every per-row entry must have the
    same length; with none, the batch size is []."""
    source = dict(tensor_dict)
    rows = None
    for key, val in tensor_dict.items():
        if isinstance(val, NonTensorStack):
            n = len(val)
        else:
            assert isinstance(val, (torch.Tensor, list, np.ndarray)), (
                f"{key} -> {type(val)} isn't of 'torch.Tensor | list | np.ndarray' type"
            )
            if _is_nested(val):
                assert val.is_contiguous(), "nested tensors must be contiguous; build them with layout=torch.jagged"
                assert val.layout == torch.jagged, "nested tensors must be jagged"
            if isinstance(val, (list, np.ndarray)):
                assert not any(isinstance(v, torch.Tensor) for v in val), (
                    "a list becomes a NonTensorStack, which cannot hold tensors: convert them to numpy first"
                )
                source[key] = _stack_of(val)
            n = val.size(0) if isinstance(val, torch.Tensor) else len(val)
        if rows is None:
            rows = n
        assert n == rows, f"Batch size of {key} is not consistent with other tensors. Expected {rows}, got {n}"
    for key, val in (non_tensor_dict or {}).items():
        assert key not in source, f"{key} is given both per row and batch-wide"
        source[key] = NonTensorData(val)
    return TensorDict(source=source, batch_size=[] if rows is None else [rows])


def index_select_tensor_dict(batch: TensorDict, indices: torch.Tensor | list[int]) -> TensorDict:
    """The rows at `indices` (1-d), in that order; batch-wide values kept; None for None."""
    if isinstance(indices, list):
        indices = torch.tensor(indices)
    assert indices.dim() == 1, "indices must be a 1-d tensor"
    if batch is None:
        return None
    picked = {}
    for key, val in batch.items():
        if _is_nested(val):
            rows = val.unbind(0)
            picked[key] = nested_tensor_from_tensor_list([rows[i] for i in indices.tolist()],
                                                         ragged_idx=_ragged_dim(val))
        elif isinstance(val, torch.Tensor) or val.shape:
            picked[key] = val[indices]
        else:  # NonTensorData: one value for the whole batch
            picked[key] = val
    return TensorDict(source=picked, batch_size=indices.shape[0])


def union_tensor_dict(tensor_dict1: TensorDict, tensor_dict2: TensorDict) -> TensorDict:
    """Add tensor_dict2's entries to tensor_dict1 in place; a key on both sides must hold equal values."""
    assert tensor_dict1.batch_size == tensor_dict2.batch_size, (
        f"Two tensor dict must have identical batch size. Got {tensor_dict1.batch_size} and {tensor_dict2.batch_size}"
    )
    for key in tensor_dict2.keys():
        if key not in tensor_dict1.keys():
            tensor_dict1[key] = tensor_dict2.get(key)
            continue
        mine, theirs = tensor_dict1[key], tensor_dict2[key]
        same = mine.equal(theirs) if isinstance(theirs, torch.Tensor) else mine == theirs
        assert same, f"{key} in tensor_dict1 and tensor_dict2 are not the same object"
    return tensor_dict1


def make_iterator(tensordict: TensorDict, mini_batch_size, epochs, seed=None, dataloader_kwargs=None):
    """Mini-batches of `mini_batch_size` rows for `epochs` passes; row order from a DataLoader over the row
    indices (`dataloader_kwargs`, e.g. shuffle), seeded by `seed`."""
    from torch.utils.data import DataLoader

    rows = tensordict.batch_size[0]
    assert rows % mini_batch_size == 0, f"{rows} % {mini_batch_size} != 0"
    dataloader_kwargs = dataloader_kwargs or {}
    assert isinstance(dataloader_kwargs, dict)
    generator = None
    if seed is not None:
        generator = torch.Generator()
        generator.manual_seed(seed)
    loader = DataLoader(dataset=torch.arange(rows), batch_size=mini_batch_size, collate_fn=lambda x: x,
                        generator=generator, **dataloader_kwargs)

    def batches():
        for _ in range(epochs):
            for idx in loader:
                yield index_select_tensor_dict(tensordict, idx)

    return iter(batches())


def assert_tensordict_eq(tensordict1: TensorDict, tensordict2: TensorDict):
    """Raise AssertionError unless both hold the same keys with equal values (jagged tensors row by row)."""
    keys1, keys2 = set(tensordict1.keys()), set(tensordict2.keys())
    assert keys1 == keys2, f"key sets differ: {keys1} vs {keys2}"
    for key in keys1:
        a, b = tensordict1[key], tensordict2[key]
        assert type(a) is type(b), f"The type of {key} must be the same. Got {type(a)} vs {type(b)}"
        if not isinstance(a, torch.Tensor):
            assert a == b, f"{key} differs"
        elif a.is_nested:
            assert b.is_nested, f"{key}: only one side is a nested tensor"
            rows_a, rows_b = a.unbind(), b.unbind()
            assert len(rows_a) == len(rows_b), f"{key}: {len(rows_a)} vs {len(rows_b)} rows"
            for ra, rb in zip(rows_a, rows_b, strict=True):
                assert torch.equal(ra, rb), f"{key}: rows differ: {ra} vs {rb}"
        else:
            assert torch.all(torch.eq(a, b)).item(), f"{key} differs"


def get(tensordict: TensorDict, key: str, default=None) -> Any:
    """The entry as plain Python (tensor, list of row objects, or the batch-wide value); `default` if absent."""
    if key not in tensordict:
        return default
    return _plain(tensordict.get(key))


def pop(tensordict: TensorDict, key: str, default=None) -> Any:
    """Like `get`, and the key is removed."""
    missing = object()
    value = tensordict.pop(key, missing)
    return default if value is missing else _plain(value)


def _take_keys(tensordict: TensorDict, keys: Iterable[str], remove: bool) -> TensorDict:
    per_row, batch_wide = {}, {}
    for key in keys:
        if key not in tensordict.keys():
            raise KeyError(f"key {key} not in tensordict")
        value = tensordict.pop(key) if remove else tensordict.get(key)
        if isinstance(value, (torch.Tensor, NonTensorStack)):
            per_row[key] = _plain(value)
        else:
            batch_wide[key] = _plain(value)
    return get_tensordict(per_row, batch_wide)


def get_keys(tensordict: TensorDict, keys: Iterable[str]) -> TensorDict:
    """A new TensorDict with only `keys` (KeyError for a missing one)."""
    return _take_keys(tensordict, keys, remove=False)


def pop_keys(tensordict: TensorDict, keys: Iterable[str]) -> TensorDict:
    """Like `get_keys`, and the keys are removed from `tensordict`."""
    keys = list(keys)
    for key in keys:  # check all first, so a missing key leaves `tensordict` as it was
        if key not in tensordict.keys():
            raise KeyError(f"key {key} not in tensordict")
    return _take_keys(tensordict, keys, remove=True)


def pad_to_divisor(data: TensorDict, size_divisor: int):
    """(data with rows repeated from its start until its length divides by size_divisor, rows added)."""
    _require_td(data)
    if len(data) % size_divisor == 0:
        if len(data) == 0:
            logger.warning("padding an empty TensorDict: nothing changed")
        return data, 0
    pad_size = size_divisor - len(data) % size_divisor
    pieces, left = [data], pad_size
    while left > 0:
        take = min(left, len(data))
        pieces.append(data[:take])
        left -= take
    return torch.cat(pieces), pad_size


def unpad(data: TensorDict, pad_size):
    """Drop the last `pad_size` rows (what pad_to_divisor added)."""
    return data[:-pad_size] if pad_size else data


def contiguous(data: TensorDict) -> TensorDict:
    """A new TensorDict with contiguous tensors and the non-tensor entries kept as they are (TensorDict's own
    `contiguous` turns batch-wide values into per-row stacks)."""
    per_row, batch_wide = {}, {}
    for key in data.keys():
        val = data.get(key)
        if isinstance(val, NonTensorData):
            batch_wide[key] = val
        elif isinstance(val, NonTensorStack):
            per_row[key] = val
        else:
            assert isinstance(val, torch.Tensor), f"Expect val to be a torch.Tensor. Got {type(val)}"
            per_row[key] = val.contiguous()
    out = get_tensordict(per_row)
    for key, val in batch_wide.items():
        out[key] = val
    return out


def maybe_fix_3d_position_ids(data: TensorDict):
    """3-d jagged `position_ids` (mRoPE: (rows, 4, seq)) are ragged along the sequence; the attribute is lost in
    transit, so set it again."""
    if "position_ids" in data.keys() and data["position_ids"].dim() == 3 and data["position_ids"].is_nested:
        data["position_ids"]._ragged_idx = 2


def list_of_dict_to_tensordict(list_of_dicts: list[dict[str, Any]]) -> TensorDict:
    """One TensorDict from rows given as dicts with the same keys: equal-shape tensors stacked, tensors of
    different lengths as a jagged tensor, anything else a NonTensorStack (needs tensordict >= 0.10)."""
    from packaging.version import parse as parse_version

    assert parse_version(tensordict.__version__) >= parse_version("0.10"), (
        "Storing non-tensor data in TensorDict at least requires tensordict version 0.10"
    )
    assert len(list_of_dicts) > 0
    columns = {key: [row[key] for row in list_of_dicts] for key in list_of_dicts[0]}
    source = {}
    for key, col in columns.items():
        if all(isinstance(v, torch.Tensor) for v in col):
            if all(v.shape == col[0].shape for v in col):
                source[key] = torch.stack(col)
            else:
                source[key] = torch.nested.as_nested_tensor(col, layout=torch.jagged)
        else:
            source[key] = NonTensorStack(*col)
    return TensorDict(source, batch_size=[len(list_of_dicts)])
