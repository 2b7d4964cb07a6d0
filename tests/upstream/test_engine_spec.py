"""`verl.workers.engine.spec`: shard boxes and the local -> full flat index map, against slicing; the
placement derived from a real (one-rank gloo) DeviceMesh, replicas, and the refused multi-dim case."""
import itertools

import pytest
import torch
from torch.distributed.tensor import Replicate, Shard

from verl.workers.engine.spec import BlockPlacement, ShardSpec, derive_dtensor_placement, translate_flat_indices


@pytest.mark.parametrize("full_shape,box,offset", [((5, 6, 7), (2, 3, 4), (3, 1, 2)), ((9, 4), (3, 4), (6, 0)),
                                                   ((11,), (4,), (5,)), ((4, 3, 2), (4, 1, 2), (0, 2, 0))])
def test_every_local_position_lands_on_its_full_position(full_shape, box, offset):
    full = torch.arange(torch.Size(full_shape).numel()).reshape(full_shape)
    local = full[tuple(slice(o, o + n) for o, n in zip(offset, box))].reshape(-1)
    place = BlockPlacement(box, offset, full_shape)
    got = translate_flat_indices(torch.arange(local.numel()), place)
    assert torch.equal(got, local)   # the value at a full position is that position
    assert place.is_flat_contiguous == (tuple(box[1:]) == tuple(full_shape[1:]))
    if place.is_flat_contiguous:
        assert place.flat_offset == int(local[0])


def test_int_place_is_a_plain_offset():
    idx = torch.tensor([0, 2, 9])
    assert torch.equal(translate_flat_indices(idx, 0), idx) and torch.equal(translate_flat_indices(idx, 7), idx + 7)


class _Mesh:
    """A mesh seen from one rank: its coordinate and per-dim sizes (enough for the replicated cases)."""

    def __init__(self, coordinate):
        self.coordinate = coordinate

    def get_coordinate(self):
        return self.coordinate


def test_replicas_contribute_once_and_several_shard_dims_are_refused():
    assert derive_dtensor_placement(ShardSpec(full_shape=(4, 4))) == (0, True, None)
    first = ShardSpec(full_shape=(4,), mesh=_Mesh([0, 0]), placements=(Replicate(), Replicate()))
    other = ShardSpec(full_shape=(4,), mesh=_Mesh([0, 1]), placements=(Replicate(), Replicate()))
    assert derive_dtensor_placement(first) == (0, True, None) and derive_dtensor_placement(other) == (0, False, None)
    with pytest.raises(NotImplementedError, match="several mesh dims"):
        derive_dtensor_placement(ShardSpec(full_shape=(4, 4), mesh=_Mesh([0, 0]), placements=(Shard(0), Shard(1))))
    with pytest.raises(AssertionError, match="dispatched by the caller"):
        derive_dtensor_placement(ShardSpec(full_shape=(4,), place=0))


def test_a_shard_on_a_real_mesh_is_its_box(tmp_path):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    if dist.is_initialized():
        pytest.skip("a process group is already up in this process")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        place, contributes, group = derive_dtensor_placement(
            ShardSpec(full_shape=(6, 3), mesh=mesh, placements=(Shard(1),)))
        assert place == BlockPlacement((6, 3), (0, 0), (6, 3)) and contributes and group is not None
        for a, b in itertools.product(range(6), range(3)):
            assert int(translate_flat_indices(torch.tensor([a * 3 + b]), place)) == a * 3 + b
    finally:
        dist.destroy_process_group()
