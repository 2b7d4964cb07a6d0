"""Upstream's small utility modules under their paths: each on real inputs with the outcome checked."""
import os
import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch


def _sleep_then(value, seconds):
    time.sleep(seconds)
    return value


# ------------------------------------------------------------------------------------------ hdfs_io / fs

def test_hdfs_io_on_local_paths_and_without_a_client(tmp_path, monkeypatch):
    from verl.utils import hdfs_io

    src = tmp_path / "a" / "f.txt"
    hdfs_io.makedirs(str(src.parent))
    src.write_text("x")
    assert hdfs_io.exists(str(src)) and not hdfs_io.exists(str(tmp_path / "none"))
    hdfs_io.copy(str(src.parent), str(tmp_path / "b"))
    assert (tmp_path / "b" / "f.txt").read_text() == "x"
    with pytest.raises(FileExistsError):
        hdfs_io.makedirs(str(src.parent))
    monkeypatch.setenv("PATH", str(tmp_path))           # no `hdfs` client on PATH
    with pytest.raises(RuntimeError, match="hdfs` command-line client"):
        hdfs_io.exists("hdfs://nn/x")


# ------------------------------------------------------------------------------------------ py_functional

def test_timeout_limit_in_a_child_process_and_with_signals():
    from verl.utils.py_functional import timeout_limit

    assert timeout_limit(5)(_sleep_then)(7, 0) == 7
    with pytest.raises(TimeoutError):
        timeout_limit(0.5)(_sleep_then)(7, 10)
    with pytest.raises(TimeoutError):
        timeout_limit(0.3, use_signals=True)(_sleep_then)(7, 10)


def test_dict_helpers_and_dynamic_enum():
    from verl.utils.metric import Metric
    from verl.utils.py_functional import (
        DynamicEnum,
        NestedNamespace,
        append_to_dict,
        list_of_dict_to_dict_of_list,
        temp_env_var,
        union_two_dict,
    )

    assert union_two_dict({"a": 1}, {"b": 2}) == {"a": 1, "b": 2}
    with pytest.raises(AssertionError, match="a"):
        union_two_dict({"a": 1}, {"a": 2})
    data = {}
    append_to_dict(data, {"loss": 1.0, "acc": [1, 2]}, prefix="actor/")
    append_to_dict(data, {"actor/loss": 3.0, "m": Metric("max", 4.0)})
    assert data["actor/loss"] == [1.0, 3.0] and data["actor/acc"] == [1, 2] and data["m"].aggregate() == 4.0
    assert NestedNamespace({"a": {"b": 1}}).a.b == 1
    assert list_of_dict_to_dict_of_list([{"x": 1}, {"x": 2}]) == {"x": [1, 2]}

    class Mode(DynamicEnum):
        _registry = {}
        _next_value = 0

    first = Mode.register("alpha")
    assert Mode.ALPHA is first and "ALPHA" in Mode and Mode.from_name("alpha") is first and Mode.names() == ["ALPHA"]
    with pytest.raises(ValueError, match="already registered"):
        Mode.register("ALPHA")
    with temp_env_var("VERL_TEST_X", "1"):
        assert os.environ["VERL_TEST_X"] == "1"
    assert "VERL_TEST_X" not in os.environ


# ------------------------------------------------------------------------------------------ import_utils

def test_import_utils_load_modules_and_classes(tmp_path):
    from verl.utils.import_utils import load_class_from_fqn, load_extern_object, load_module

    path = tmp_path / "mine.py"
    path.write_text("VALUE = 41 + 1\n")
    assert load_module(str(path)).VALUE == 42 and load_module(f"file://{path}").VALUE == 42
    assert load_extern_object(str(path), "VALUE") == 42
    assert load_module("pkg://verl.utils.hdfs_io").exists is not None
    assert load_class_from_fqn("collections.OrderedDict").__name__ == "OrderedDict"
    with pytest.raises(ValueError, match="fully qualified"):
        load_class_from_fqn("OrderedDict")
    with pytest.raises(AttributeError, match="NOPE"):
        load_extern_object(str(path), "NOPE")
    with pytest.raises(FileNotFoundError):
        load_module(str(tmp_path / "missing.py"))


# ------------------------------------------------------------------------------------------ model

def test_model_helpers():
    from verl.utils import model

    assert model.get_model_size(torch.nn.Linear(1000, 1000)) == (pytest.approx(1.001), "M")
    np.random.seed(0)
    mask = model.create_random_mask(torch.zeros(8, 20, dtype=torch.long), 0.5, 0.3)
    for row in mask.tolist():      # one run of ones: some left padding, then 1..10 valid tokens
        ones = [i for i, v in enumerate(row) if v]
        assert ones == list(range(ones[0], ones[-1] + 1)) and 1 <= len(ones) <= 10 and ones[0] <= 6
    lora = SimpleNamespace(target_modules=["q_proj"], layers_to_transform=[1], layers_pattern=None)
    assert model.check_target_modules(lora, "model.layers.1.self_attn.q_proj")
    assert not model.check_target_modules(lora, "model.layers.0.self_attn.q_proj")
    assert model.check_exclude_modules(SimpleNamespace(exclude_modules=["lm_head"]), "model.lm_head")
    tokens, cu, longest = model.pad_packed_inputs(torch.arange(5), torch.tensor([0, 2, 5]), 3, 4)
    assert tokens.tolist() == [0, 1, 2, 3, 4, 0, 0, 0] and cu.tolist() == [0, 2, 5, 8] and longest == 3
    renamed = SimpleNamespace(_checkpoint_conversion_mapping={"^language_model.model": "model.language_model"})
    assert list(model.convert_weight_keys({"model.language_model.w": 1}, renamed)) == ["language_model.model.w"]
    with pytest.raises(NotImplementedError, match="Megatron"):
        model.load_mcore_dist_weights(None, "")


# ------------------------------------------------------------------------------------------ small modules

def test_debug_metrics_on_a_batch():
    from verl.protocol import DataProto
    from verl.utils.debug import calculate_debug_metrics

    actor = torch.log(torch.tensor([[0.5, 0.25, 0.9]]))
    rollout = torch.log(torch.tensor([[0.4, 0.25, 0.9]]))
    batch = DataProto.from_dict(tensors={"old_log_probs": actor, "rollout_log_probs": rollout,
                                         "responses": torch.zeros(1, 3), "response_mask": torch.tensor([[1, 1, 0]])})
    m = calculate_debug_metrics(batch)
    assert m["training/rollout_probs_diff_valid"] == 1
    assert m["training/rollout_probs_diff_max"] == pytest.approx(0.1, abs=1e-6)
    assert m["training/rollout_probs_diff_mean"] == pytest.approx(0.05, abs=1e-6)


def test_dtypes_ports_trace_flops_and_profiler():
    from verl.compat import torch_dtype
    from verl.utils.flops_counter import FlopsCounter, get_device_flops
    from verl.utils.net_utils import get_free_port, is_ipv4, is_valid_ipv6_address
    from verl.utils.profiler import DistProfiler
    from verl.utils.rollout_trace import RolloutTraceConfig, rollout_trace_op
    from verl.utils.torch_dtypes import PrecisionType

    assert PrecisionType.to_dtype("bf16") is torch_dtype("bf16") and PrecisionType.to_str(torch.float16) == "fp16"
    assert is_ipv4("10.0.0.1") and is_valid_ipv6_address("[::1]") and not is_ipv4("::1")
    port, sock = get_free_port("127.0.0.1", with_alive_sock=True)
    assert sock.getsockname()[1] == port
    sock.close()

    class Tool:
        @rollout_trace_op
        def run(self, x):
            return x + 1

    assert Tool().run(1) == 2
    with pytest.raises(NotImplementedError, match="tracing"):
        RolloutTraceConfig.init("p", "e", backend="weave")
    assert get_device_flops(device_name="h100-80gb") == pytest.approx(989.4)
    config = SimpleNamespace(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, intermediate_size=128,
                             num_hidden_layers=2, vocab_size=100)
    achieved, _ = FlopsCounter(config).estimate_flops([10, 20], delta_time=1.0)
    from verl.utils.flops import training_flops

    assert achieved == pytest.approx(training_flops(config, [10, 20]) / 1e12)
    with pytest.raises(NotImplementedError, match="profile_step"):
        DistProfiler(0, SimpleNamespace(tool="torch", enable=True))
    assert DistProfiler(0, SimpleNamespace(tool=None, enable=False)).check_enable() is False
