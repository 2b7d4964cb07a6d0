"""Upstream's shard-placement vocabulary (`verl.workers.engine.spec`), working here although the engine-based
workers around it are not: where one rank's local shard of a parameter sits in the full tensor, and how a flat
position inside the shard maps to the full tensor's flat position. Custom weight-sync code (sending only the
changed elements of each shard) uses these; they are plain index arithmetic, checked against slicing in
tests/upstream/test_engine_spec.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

__all__ = ["BlockPlacement", "ShardSpec", "derive_dtensor_placement", "translate_flat_indices"]


def _strides(shape) -> tuple:
    """Row-major (C order) strides of `shape`, in elements."""
    out, step = [], 1
    for size in reversed(tuple(int(s) for s in shape)):
        out.append(step)
        step *= size
    return tuple(reversed(out))


@dataclass(frozen=True)
class BlockPlacement:
    """A shard that is the box `full[o0:o0+l0, o1:o1+l1, ...]` of the full tensor (`local_shape` l, `global_offset`
    o). When only dim 0 is cut the box is one contiguous flat range starting at `flat_offset`."""

    local_shape: tuple
    global_offset: tuple
    full_shape: tuple

    @property
    def local_strides(self) -> tuple:
        return _strides(self.local_shape)

    @property
    def full_strides(self) -> tuple:
        return _strides(self.full_shape)

    @property
    def is_flat_contiguous(self) -> bool:
        return tuple(int(s) for s in self.local_shape[1:]) == tuple(int(s) for s in self.full_shape[1:])

    @property
    def flat_offset(self) -> int:
        """The flat start of the box (meaningful when `is_flat_contiguous`)."""
        return int(self.global_offset[0]) * self.full_strides[0] if self.full_shape else 0


@dataclass
class ShardSpec:
    """How one exported local shard is distributed: a DeviceMesh with one Placement per mesh dim (None: the
    local tensor is the whole parameter), or an explicit `place` with its `gather_group` for layouts DTensor
    does not describe. `to_hf_chunk` / `hf_slots` describe a dim-0-separable conversion to Hugging Face tensors."""

    full_shape: tuple
    mesh: Optional[object] = None
    placements: Optional[tuple] = None
    place: Optional[int | BlockPlacement] = None
    gather_group: Optional[object] = None
    contributes: bool = True
    to_hf_chunk: Optional[Callable[[int, torch.Tensor], list]] = None
    hf_slots: Optional[list] = None

    @classmethod
    def from_param(cls, param: torch.Tensor) -> "ShardSpec":
        from torch.distributed.tensor import DTensor

        if isinstance(param, DTensor):
            return cls(full_shape=tuple(param.shape), mesh=param.device_mesh, placements=tuple(param.placements))
        return cls(full_shape=tuple(param.shape))


def translate_flat_indices(lidx: torch.Tensor, place: int | BlockPlacement) -> torch.Tensor:
    """Full-tensor flat positions of the shard-local flat positions `lidx`. An int `place` is a flat offset;
    a box cut only on dim 0 is one too; any other box is decomposed into per-dim coordinates by the local
    strides, shifted by the offset and recomposed with the full strides."""
    if isinstance(place, int):
        return lidx + place if place else lidx
    if place.is_flat_contiguous:
        return lidx + place.flat_offset if place.flat_offset else lidx
    full = torch.zeros_like(lidx)
    rest = lidx
    for local_stride, offset, full_stride in zip(place.local_strides, place.global_offset, place.full_strides):
        coordinate = torch.div(rest, local_stride, rounding_mode="floor")
        rest = rest - coordinate * local_stride
        full = full + (coordinate + int(offset)) * full_stride
    return full


def derive_dtensor_placement(spec: ShardSpec):
    """(place, contributes, gather_group) of this rank for a spec described by its mesh and placements: an
    unsharded or replicated parameter is place 0 with no group (only the first replica contributes); a
    parameter sharded over one mesh dim is its BlockPlacement with that dim's process group. Specs with an
    explicit `place` are for the caller to read as they are."""
    assert spec.place is None, "specs with an explicit place are dispatched by the caller, not derived"
    import torch.distributed as dist

    if spec.mesh is None:
        return 0, (dist.get_rank() == 0 if dist.is_available() and dist.is_initialized() else True), None
    placements = tuple(spec.placements)
    coordinate = spec.mesh.get_coordinate()
    contributes = coordinate is None or all(c == 0 for c, p in zip(coordinate, placements) if p.is_replicate())
    sharded = [d for d, p in enumerate(placements) if not p.is_replicate() and hasattr(p, "dim")]
    if not sharded:
        return 0, contributes, None
    if len(sharded) > 1:
        raise NotImplementedError("a parameter sharded over several mesh dims (expert x FSDP meshes) needs the "
                                  "engine-based workers' gather groups, which this verl does not have")
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    local_shape, offset = compute_local_shape_and_global_offset(tuple(spec.full_shape), spec.mesh, list(placements))
    place = BlockPlacement(tuple(local_shape), tuple(offset), tuple(spec.full_shape))
    return place, contributes, spec.mesh.get_group(mesh_dim=sharded[0])
