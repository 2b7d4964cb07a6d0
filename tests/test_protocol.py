"""DataProto and TensorBatch: every method, the merge rules, padding and pickling."""

import pickle

import numpy as np
import pytest
import torch

from verl.protocol import (
    DataProto,
    DataProtoConfig,
    DataProtoItem,
    TensorBatch,
    collate_fn,
    pad_dataproto_to_divisor,
    union_numpy_dict,
    union_tensor_dict,
    unpad_dataproto,
)


def make(n=4, meta=None):
    return DataProto.from_single_dict(
        {
            "x": torch.arange(n, dtype=torch.float32),
            "ids": torch.arange(n * 3).reshape(n, 3),
            "uid": np.array([f"u{i}" for i in range(n)], dtype=object),
        },
        meta_info=meta or {"temperature": 1.0},
    )


# ---- TensorBatch --------------------------------------------------------------------------------


def test_tensor_batch_shape_checks_and_access():
    tb = TensorBatch({"a": torch.zeros(3, 2), "b": torch.ones(3)})
    assert tb.batch_size == torch.Size([3]) and tb.batch_size[0] == 3
    assert len(tb) == 3 and sorted(tb.keys()) == ["a", "b"] and "a" in tb and "z" not in tb
    assert tb.get("z") is None and tb.device == torch.device("cpu")
    with pytest.raises(ValueError, match="'c' has leading shape \\(4,\\), batch size is \\(3,\\)"):
        tb["c"] = torch.zeros(4)
    with pytest.raises(TypeError, match="must be a torch.Tensor"):
        tb["c"] = [1, 2, 3]
    tb.update({"c": torch.arange(3)})
    assert tb["c"].tolist() == [0, 1, 2]
    assert tb.pop("c").tolist() == [0, 1, 2] and "c" not in tb
    with pytest.raises(KeyError, match="'nope'.*has \\['a', 'b'\\]"):
        tb.select("nope")
    assert list(tb.select("b").keys()) == ["b"]
    assert list(tb.exclude("b").keys()) == ["a"]


def test_tensor_batch_indexing_and_splits():
    tb = TensorBatch({"a": torch.arange(10).reshape(5, 2)})
    assert tb[1]["a"].tolist() == [2, 3] and tb[1].batch_size == torch.Size([])
    assert tb[1:3]["a"][:, 0].tolist() == [2, 4] and tb[1:3].batch_size[0] == 2
    assert tb[[4, 0]]["a"][:, 0].tolist() == [8, 0]
    assert tb[np.array([True, False, True, False, False])]["a"][:, 0].tolist() == [0, 4]
    assert tb[torch.tensor([3])].batch_size == torch.Size([1])
    assert [len(p) for p in tb.chunk(3)] == [2, 2, 1]
    assert [len(p) for p in tb.split(2)] == [2, 2, 1]
    both = torch.cat([tb[:2], tb[2:]])  # TensorDict-style torch.cat keeps working
    assert isinstance(both, TensorBatch) and both == tb
    stacked = torch.stack([tb[0], tb[1]])
    assert stacked.batch_size == torch.Size([2]) and stacked["a"].tolist() == [[0, 1], [2, 3]]
    with pytest.raises(ValueError, match="different keys"):
        TensorBatch.cat([tb, TensorBatch({"b": torch.zeros(5)})])
    moved = tb.to("meta")
    assert moved.device == torch.device("meta") and tb.device == torch.device("cpu")
    tb.rename_key_("a", "b")
    assert list(tb.keys()) == ["b"]


# ---- construction and access --------------------------------------------------------------------


def test_from_dict_and_from_single_dict():
    d = make()
    assert len(d) == 4 and d.batch.batch_size[0] == 4
    assert set(d.batch.keys()) == {"x", "ids"} and set(d.non_tensor_batch) == {"uid"}
    listed = DataProto.from_dict({"x": torch.zeros(2)}, {"tags": ["a", "b"]})
    assert listed.non_tensor_batch["tags"].dtype == object
    with pytest.raises(ValueError, match="'x' has \\(2,\\), 'y' has \\(3,\\)"):
        DataProto.from_dict({"x": torch.zeros(2), "y": torch.zeros(3)})
    with pytest.raises(TypeError, match="'bad' is a list"):
        DataProto.from_single_dict({"bad": [1, 2]})
    with pytest.raises(ValueError, match="disagree on the number of samples"):
        DataProto.from_dict({"x": torch.zeros(2)}, {"uid": np.array([1, 2, 3], dtype=object)})
    empty = DataProto.from_single_dict({}, meta_info={"metrics": {"a": 1}})
    assert len(empty) == 0 and empty.batch is None
    assert len(DataProto(non_tensor_batch={"a": np.arange(3)})) == 3


def test_getitem_variants():
    d = make(5)
    item = d[2]
    assert isinstance(item, DataProtoItem)
    assert item.batch["x"].item() == 2.0 and item.non_tensor_batch["uid"] == "u2"
    assert item.meta_info == {"temperature": 1.0}
    assert d[np.int64(1)].batch["x"].item() == 1.0
    assert d[1:4].batch["x"].tolist() == [1.0, 2.0, 3.0]
    assert d[::2].non_tensor_batch["uid"].tolist() == ["u0", "u2", "u4"]
    assert d[[4, 0]].non_tensor_batch["uid"].tolist() == ["u4", "u0"]
    assert d[np.array([0, 3])].batch["x"].tolist() == [0.0, 3.0]
    assert d[torch.tensor([1, 2])].batch["ids"][:, 0].tolist() == [3, 6]
    mask = torch.tensor([True, False, True, False, True])
    assert d[mask].non_tensor_batch["uid"].tolist() == ["u0", "u2", "u4"]
    assert d.slice(3).batch["x"].tolist() == [3.0, 4.0]
    with pytest.raises(TypeError, match="indexed with str"):
        d["x"]


def test_select_and_deepcopy():
    d = make(meta={"temperature": 0.5, "eos": [1]})
    s = d.select(batch_keys=["x"], non_tensor_batch_keys=["uid"], meta_info_keys=["eos"])
    assert list(s.batch.keys()) == ["x"] and list(s.meta_info) == ["eos"] and len(s) == 4
    deep = d.select(deepcopy=True)
    deep.meta_info["eos"].append(2)
    deep.non_tensor_batch["uid"][0] = "changed"
    assert d.meta_info["eos"] == [1] and d.non_tensor_batch["uid"][0] == "u0"
    with pytest.raises(KeyError, match="nope"):
        d.select(batch_keys=["nope"])
    with pytest.raises(KeyError, match="non_tensor_batch keys \\['nope'\\]"):
        d.select(non_tensor_batch_keys=["nope"])


def test_pop_and_rename():
    d = make()
    popped = d.pop(batch_keys=["ids"], non_tensor_batch_keys=["uid"], meta_info_keys=["temperature"])
    assert list(popped.batch.keys()) == ["ids"] and "uid" in popped.non_tensor_batch
    assert popped.meta_info == {"temperature": 1.0}
    assert list(d.batch.keys()) == ["x"] and d.non_tensor_batch == {} and d.meta_info == {}
    with pytest.raises(KeyError, match="cannot pop \\['ids'\\]"):
        d.pop(batch_keys=["ids"])
    d.rename("x", "y")
    assert list(d.batch.keys()) == ["y"]


# ---- union --------------------------------------------------------------------------------------


def test_union_merges_and_checks_conflicts():
    a = make()
    b = DataProto.from_dict(
        {"x": torch.arange(4, dtype=torch.float32), "new": torch.ones(4)},
        {"uid": a.non_tensor_batch["uid"].copy(), "extra": np.array([np.nan] * 4, dtype=object)},
        meta_info={"temperature": 1.0, "k": 2},
    )
    out = a.union(b)
    assert out is a and set(a.batch.keys()) == {"x", "ids", "new"}
    assert set(a.non_tensor_batch) == {"uid", "extra"} and a.meta_info == {"temperature": 1.0, "k": 2}
    # NaN equals NaN for the conflict check
    assert a.union(DataProto.from_dict(non_tensors={"extra": np.array([np.nan] * 4, dtype=object)})) is a

    with pytest.raises(ValueError, match="batch key 'x'"):
        make().union(DataProto.from_dict({"x": torch.zeros(4)}))
    with pytest.raises(ValueError, match="non_tensor_batch key 'uid'"):
        make().union(DataProto.from_dict(non_tensors={"uid": np.array(list("abcd"), dtype=object)}))
    with pytest.raises(ValueError, match="meta_info key 'temperature'"):
        make().union(DataProto(meta_info={"temperature": 0.7}))
    with pytest.raises(ValueError, match="4 and 3 samples"):
        make().union(make(3))
    # a DataProto without tensors (e.g. only metrics) unions into one with tensors and back
    metrics_only = DataProto.from_single_dict({}, meta_info={"metrics": {"m": 1}})
    assert make().union(metrics_only).meta_info["metrics"] == {"m": 1}
    assert len(metrics_only.union(make())) == 4


def test_union_helpers():
    t1, t2 = TensorBatch({"a": torch.zeros(2)}), TensorBatch({"b": torch.ones(2)})
    assert set(union_tensor_dict(t1, t2).keys()) == {"a", "b"}
    with pytest.raises(ValueError, match="different sizes"):
        union_tensor_dict(TensorBatch({"a": torch.zeros(2)}), TensorBatch({"a": torch.zeros(3)}))
    merged = union_numpy_dict({"a": np.array([1, 2])}, {"a": np.array([1, 2]), "b": np.array(["x", "y"])})
    assert set(merged) == {"a", "b"}
    with pytest.raises(ValueError, match="'a'"):
        union_numpy_dict({"a": np.array([1, 2])}, {"a": np.array([1, 3])})


# ---- chunk / split / concat ----------------------------------------------------------------------


def test_chunk_even_and_errors():
    parts = make(6).chunk(3)
    assert [len(p) for p in parts] == [2, 2, 2]
    assert parts[1].non_tensor_batch["uid"].tolist() == ["u2", "u3"]
    assert all(p.meta_info == {"temperature": 1.0} for p in parts)
    with pytest.raises(ValueError, match="5 samples into 2 equal parts"):
        make(5).chunk(2)
    padded_ok = DataProto.from_dict({"x": torch.arange(5)}, auto_padding=True)
    assert [len(p) for p in padded_ok.chunk(2)] == [3, 2]


def test_global_auto_padding_switch(monkeypatch):
    monkeypatch.setattr(DataProtoConfig, "_auto_padding", False)
    assert not make(5).is_padding_enabled()
    DataProtoConfig.auto_padding = True
    assert make(5).is_padding_enabled() and len(make(5).chunk(2)) == 2
    DataProtoConfig.auto_padding = False
    monkeypatch.setenv("VERL_AUTO_PADDING", "1")
    assert make(5).is_padding_enabled()
    with pytest.raises(TypeError):
        DataProtoConfig.auto_padding = "yes"


def test_split():
    parts = make(5).split(2)
    assert [len(p) for p in parts] == [2, 2, 1]
    assert parts[2].batch["x"].tolist() == [4.0]


def test_concat_merges_worker_metrics():
    w0 = make(2, meta={"temperature": 1.0, "metrics": {"actor/pg_loss": 0.5, "actor/lr": 1e-6}})
    w1 = make(2, meta={"temperature": 1.0, "metrics": {"actor/pg_loss": 0.7, "actor/lr": 1e-6}})
    out = DataProto.concat([w0, w1])
    assert len(out) == 4 and out.non_tensor_batch["uid"].tolist() == ["u0", "u1", "u0", "u1"]
    assert out.meta_info == {"temperature": 1.0, "metrics": {"actor/pg_loss": [0.5, 0.7], "actor/lr": [1e-6, 1e-6]}}
    # workers that report lists of metric dicts (one per mini-batch) are flattened in order
    a = DataProto(meta_info={"metrics": [{"loss": 1}, {"loss": 2}]})
    b = DataProto(meta_info={"metrics": [{"loss": 3}]})
    assert DataProto.concat([a, b]).meta_info["metrics"] == {"loss": [1, 2, 3]}
    with pytest.raises(ValueError, match="meta_info\\['temperature'\\] differs"):
        DataProto.concat([make(2), make(2, meta={"temperature": 0.3})])
    with pytest.raises(ValueError, match="non_tensor_batch keys differ"):
        DataProto.concat([make(2), DataProto.from_dict({"x": torch.zeros(2), "ids": torch.zeros(2, 3)})])
    with pytest.raises(ValueError, match="at least one"):
        DataProto.concat([])


# ---- repeat / reorder / iterate --------------------------------------------------------------------


def test_repeat_interleave_vs_tile():
    d = make(3)
    inter = d.repeat(2, interleave=True)
    assert inter.batch["x"].tolist() == [0, 0, 1, 1, 2, 2]
    assert inter.non_tensor_batch["uid"].tolist() == ["u0", "u0", "u1", "u1", "u2", "u2"]
    assert inter.batch["ids"].shape == (6, 3) and inter.meta_info == d.meta_info
    tiled = d.repeat(2, interleave=False)
    assert tiled.batch["x"].tolist() == [0, 1, 2, 0, 1, 2]
    assert tiled.non_tensor_batch["uid"].tolist() == ["u0", "u1", "u2", "u0", "u1", "u2"]
    assert d.sample_level_repeat([1, 0, 2]).batch["x"].tolist() == [0, 2, 2]


def test_reorder_in_place():
    d = make(4)
    d.reorder(torch.tensor([3, 1, 0, 2]))
    assert d.batch["x"].tolist() == [3, 1, 0, 2]
    assert d.non_tensor_batch["uid"].tolist() == ["u3", "u1", "u0", "u2"]


def test_make_iterator_and_collate():
    d = make(4)
    batches = list(d.make_iterator(mini_batch_size=2, epochs=2))
    assert len(batches) == 4 and all(len(b) == 2 for b in batches)
    assert batches[0].batch["x"].tolist() == [0, 1] and batches[0].meta_info == d.meta_info
    assert batches[1].non_tensor_batch["uid"].tolist() == ["u2", "u3"]
    shuffled = list(d.make_iterator(2, 1, seed=0, dataloader_kwargs={"shuffle": True}))
    assert sorted(torch.cat([b.batch["x"] for b in shuffled]).tolist()) == [0, 1, 2, 3]
    assert collate_fn([d[1], d[0]]).batch["x"].tolist() == [1, 0]
    with pytest.raises(ValueError, match="mini-batches of 3"):
        next(d.make_iterator(3, 1))


def test_to_device_moves_tensors_only():
    d = make()
    assert d.to("meta") is d and d.batch.device == torch.device("meta")
    assert d.non_tensor_batch["uid"][0] == "u0"


# ---- padding --------------------------------------------------------------------------------------


@pytest.mark.parametrize("n,divisor,expected_pad", [(5, 4, 3), (8, 4, 0), (2, 7, 5), (1, 3, 2)])
def test_pad_unpad_round_trip(n, divisor, expected_pad):
    d = make(n)
    padded, pad = pad_dataproto_to_divisor(d, divisor)
    assert pad == expected_pad and len(padded) % divisor == 0 and len(padded) == n + pad
    # padding rows are copies of real rows, cycling from the start
    assert padded.batch["x"][n:].tolist() == [float(i % n) for i in range(pad)]
    back = unpad_dataproto(padded, pad)
    assert torch.equal(back.batch["ids"], d.batch["ids"])
    assert back.non_tensor_batch["uid"].tolist() == d.non_tensor_batch["uid"].tolist()


def test_padding_method_repeats_last_row():
    d = make(3)
    d.padding(2)
    assert d.batch["x"].tolist() == [0, 1, 2, 2, 2]
    d.padding(1, padding_candidate="first")
    assert d.non_tensor_batch["uid"].tolist()[-1] == "u0"


# ---- pickling -------------------------------------------------------------------------------------


def test_pickle_round_trip_keeps_everything(tmp_path):
    d = make(meta={"temperature": 0.9, "metrics": {"a": [1.0]}})
    d.batch["half"] = torch.randn(4, 2, dtype=torch.float16)
    d.batch["mask"] = torch.tensor([True, False, True, True])
    d.batch["strided"] = torch.arange(16.0).reshape(4, 4)[:, ::2]  # non-contiguous view
    d.non_tensor_batch["obj"] = np.array([{"k": i} for i in range(4)], dtype=object)
    back = pickle.loads(pickle.dumps(d))
    assert set(back.batch.keys()) == set(d.batch.keys())
    for key, value in d.batch.items():
        assert back.batch[key].dtype == value.dtype and torch.equal(back.batch[key], value), key
    assert back.batch["mask"].dtype == torch.bool
    assert back.non_tensor_batch["obj"][2] == {"k": 2} and back.meta_info == d.meta_info
    back.batch["x"][0] = 100.0  # unpickled tensors are writable and independent
    assert d.batch["x"][0] == 0.0
    path = tmp_path / "batch.pkl"
    d.save_to_disk(path)
    assert torch.equal(DataProto.load_from_disk(path).batch["ids"], d.batch["ids"])


def test_pickled_size_is_the_data_not_the_parent_storage():
    n = 1_000_000
    d = DataProto.from_dict({"x": torch.zeros(n, dtype=torch.float32)})
    whole = len(pickle.dumps(d))
    assert 4 * n <= whole < 4 * n + 4096  # raw bytes plus a small header
    quarter = d.chunk(4)[0]
    assert len(pickle.dumps(quarter)) < n + 4096  # a chunk ships its own rows only
    # protocol 5 (what Ray uses) can hand the bytes over out of band, without a copy
    buffers = []
    pickle.dumps(d, protocol=5, buffer_callback=buffers.append)
    assert sum(memoryview(b).nbytes for b in buffers) == 4 * n


def test_nbytes_and_print_size(capsys):
    d = DataProto.from_dict({"x": torch.zeros(10, dtype=torch.float32)}, {"a": np.zeros(10)})
    assert d.nbytes() == (40, 80)
    d.print_size(prefix="step 1")
    assert capsys.readouterr().out.startswith("step 1, size of tensors")
