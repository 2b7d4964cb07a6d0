"""verl.utils.tensordict_utils (upstream's TensorDict helpers) on the optional tensordict package, and the
DataProto <-> TensorDict paths in verl.protocol. Skipped where tensordict is not installed, except the check
that the helpers then say how to install it."""
import subprocess
import sys

import numpy as np
import pytest
import torch

from verl.protocol import DataProto, fold_batch_dim, unfold_batch_dim


def test_without_tensordict_the_import_error_names_the_extra():
    code = ("import sys; sys.modules['tensordict'] = None\n"
            "try:\n    import verl.utils.tensordict_utils\nexcept ImportError as e:\n    print(e)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "pip install 'verl[tensordict]'" in out.stdout, out.stderr


def test_fold_and_unfold_group_consecutive_rows():
    data = DataProto.from_dict(tensors={"x": torch.arange(12).reshape(6, 2)},
                               non_tensors={"uid": np.array(list("aabbcc"), dtype=object)}, meta_info={"k": 1})
    folded = fold_batch_dim(data, new_batch_size=3)
    assert folded.batch.batch_size == torch.Size([3]) and folded.batch["x"].shape == (3, 2, 2)
    assert folded.non_tensor_batch["uid"].tolist() == [["a", "a"], ["b", "b"], ["c", "c"]]
    folded.reorder(torch.tensor([2, 0, 1]))
    back = unfold_batch_dim(folded, batch_dims=2)
    assert back.batch["x"][:, 0].tolist() == [8, 10, 0, 2, 4, 6]
    assert back.non_tensor_batch["uid"].tolist() == list("ccaabb") and back.meta_info == {"k": 1}
    with pytest.raises(ValueError, match="cannot fold 6 rows into 4"):
        fold_batch_dim(data, 4)


tensordict = pytest.importorskip("tensordict")
from tensordict import TensorDict  # noqa: E402

from verl.protocol import deserialize_tensordict, serialize_tensordict  # noqa: E402
from verl.utils import tensordict_utils as tu  # noqa: E402


def _mrope_rows(lengths):
    """3-d jagged position ids as Qwen2-VL has them: (rows, 3, seq), ragged along the sequence."""
    return [torch.arange(n).expand(3, n) + 100 * i for i, n in enumerate(lengths)]


def test_get_tensordict_sorts_rows_and_batch_wide_values():
    td = tu.get_tensordict({"x": torch.arange(3), "turns": [[], [0.5], [{"a": 1}]]}, {"temperature": 0.7})
    assert td.batch_size == torch.Size([3])
    assert tu.get(td, "turns") == [[], [0.5], [{"a": 1}]]
    assert tu.get(td, "temperature") == 0.7 and tu.get(td, "missing", 5) == 5
    with pytest.raises(AssertionError, match="Expected 3, got 2"):
        tu.get_tensordict({"x": torch.arange(3), "y": torch.arange(2)})
    popped = tu.pop_keys(td, ["turns", "temperature"])
    assert set(td.keys()) == {"x"} and tu.get(popped, "temperature") == 0.7
    with pytest.raises(KeyError):
        tu.pop_keys(td, ["x", "nope"])
    assert set(td.keys()) == {"x"}  # a missing key leaves the TensorDict as it was


def test_chunk_then_concat_restores_3d_jagged_rows():
    rows = _mrope_rows([2, 5, 3, 4])
    pos = tu.nested_tensor_from_tensor_list(rows, ragged_idx=2)
    td = tu.get_tensordict({"pos": pos, "x": torch.arange(4), "tag": list("abcd")}, {"step": 3})
    parts = tu.chunk_tensordict(td, 2)
    assert [p["x"].tolist() for p in parts] == [[0, 1], [2, 3]]
    assert [r.shape[-1] for r in parts[1]["pos"].unbind(0)] == [3, 4]
    joined = tu.concat_tensordict(parts)
    for got, want in zip(joined["pos"].unbind(0), rows, strict=True):
        assert torch.equal(got, want)
    assert tu.get(joined, "tag") == list("abcd") and tu.get(joined, "step") == 3


def test_index_select_pad_and_unpad():
    td = tu.get_tensordict({"x": torch.tensor([10, 11, 12]), "ids": torch.nested.as_nested_tensor(
        [torch.arange(n) for n in (1, 2, 3)], layout=torch.jagged)}, {"name": "run"})
    picked = tu.index_select_tensor_dict(td, [2, 0])
    assert picked["x"].tolist() == [12, 10] and [len(r) for r in picked["ids"].unbind(0)] == [3, 1]
    assert tu.get(picked, "name") == "run"
    plain = tu.get_tensordict({"x": torch.tensor([1, 2, 3]), "tag": list("abc")}, {"name": "run"})
    padded, pad = tu.pad_to_divisor(plain, 7)
    assert pad == 4 and padded["x"].tolist() == [1, 2, 3, 1, 2, 3, 1]
    assert tu.unpad(padded, pad)["x"].tolist() == [1, 2, 3]


def test_union_requires_equal_shared_values():
    a = tu.get_tensordict({"x": torch.arange(3)}, {"t": 1})
    tu.union_tensor_dict(a, tu.get_tensordict({"x": torch.arange(3), "y": torch.ones(3)}))
    assert set(a.keys()) == {"x", "y", "t"}
    with pytest.raises(AssertionError, match="not the same object"):
        tu.union_tensor_dict(a, tu.get_tensordict({"x": torch.arange(3) + 1}))


def test_serialize_round_trip_and_dataproto_conversions():
    td = TensorDict({"x": torch.randn(3, 2, dtype=torch.float32),
                     "ids": torch.nested.as_nested_tensor([torch.arange(n) for n in (2, 1, 3)], layout=torch.jagged)},
                    batch_size=[3])
    back = deserialize_tensordict(serialize_tensordict(td))
    tu.assert_tensordict_eq(back, td)
    # a TensorDict given as DataProto.batch (upstream's batch type) becomes this verl's TensorBatch
    data = DataProto(batch=TensorDict({"x": torch.arange(4)}, batch_size=[4]))
    assert data.batch["x"].tolist() == [0, 1, 2, 3] and len(data) == 4
    with pytest.raises(TypeError, match="tensors only"):
        DataProto(batch=tu.get_tensordict({"x": torch.arange(2), "tag": ["a", "b"]}))
    # and back: non-tensor columns and meta_info survive the round trip
    dp = DataProto.from_dict({"x": torch.arange(2)}, {"turns": [[1], []]}, meta_info={"k": "v"})
    again = DataProto.from_tensordict(dp.to_tensordict())
    assert again.non_tensor_batch["turns"].tolist() == [[1], []] and again.meta_info == {"k": "v"}
