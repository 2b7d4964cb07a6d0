"""Upstream modules made to work here in issue 27's last round: weight bucketing with fusion groups, buffer
updates, merged-folder validation, token-id normalisation, the transformers helpers, and the stand-ins beside
them raising NotImplementedError that names the feature."""
import asyncio
import importlib
import json

import pytest
import torch

from verl._unsupported import UnsupportedFeatureError
from verl.workers.rollout.sglang_rollout.utils import DEEPSEEK_V4_FUSION_GROUPS, get_named_tensor_buckets


def _bucket(items, nbytes, groups=()):
    async def run():
        return [[name for name, _ in b] async for b in get_named_tensor_buckets(items, nbytes, groups)]

    return asyncio.run(run())


def _t(nbytes):
    return torch.zeros(nbytes, dtype=torch.uint8)


def test_buckets_hold_at_most_the_limit_and_keep_the_order():
    items = [("a", _t(400)), ("b", _t(400)), ("c", _t(300)), ("big", _t(2000)), ("d", _t(10))]
    assert _bucket(iter(items), 1000) == [["a", "b"], ["c"], ["big"], ["d"]]

    async def agen():   # an async source works the same
        for item in items:
            yield item

    assert _bucket(agen(), 1000) == [["a", "b"], ["c"], ["big"], ["d"]]
    with pytest.raises(ValueError, match="positive"):
        _bucket(iter(items), 0)


def test_a_fusion_group_lands_in_one_bucket_even_when_its_members_are_apart():
    layer = "model.layers.3.self_attn"
    items = [(f"{layer}.wq_a.weight", _t(300)), ("x", _t(600)), (f"{layer}.wkv.weight", _t(300)), ("y", _t(50))]
    buckets = _bucket(iter(items), 1000, DEEPSEEK_V4_FUSION_GROUPS)
    # wq_a waits for wkv; x fills the first bucket; the pair would overflow it, so it starts the next one
    assert buckets == [["x"], [f"{layer}.wq_a.weight", f"{layer}.wkv.weight", "y"]]
    # the compressor pair is its own group, not the attention pair's
    with pytest.raises(ValueError, match="never completed"):
        _bucket(iter([(f"{layer}.compressor.wkv.weight", _t(8))]), 1000, DEEPSEEK_V4_FUSION_GROUPS)


def test_a_view_is_copied_out_of_its_base():
    base = torch.arange(100, dtype=torch.float32)

    async def run():
        return [b async for b in get_named_tensor_buckets(iter([("v", base[:4]), ("w", base)]), 10_000)]

    (bucket,) = asyncio.run(run())
    assert bucket[0][1]._base is None and torch.equal(bucket[0][1], base[:4]) and bucket[1][1] is base


def test_buffer_updates_are_split_out_and_copied_in_place():
    from verl.workers.rollout.vllm_rollout.weight_update_utils import apply_buffer_updates, split_buffer_updates

    model = torch.nn.BatchNorm1d(3)
    weights = [("weight", torch.ones(3)), ("running_mean", torch.full((3,), 2.0, dtype=torch.float64)),
               ("num_batches_tracked", torch.tensor(7))]
    params, buffers, named = split_buffer_updates(model, weights)
    assert [n for n, _ in params] == ["weight"] and [n for n, _ in buffers] == ["running_mean", "num_batches_tracked"]
    assert apply_buffer_updates(model, buffers + [("gone", torch.ones(1))], named) == 2
    assert torch.equal(model.running_mean, torch.full((3,), 2.0)) and model.running_mean.dtype == torch.float32
    assert int(model.num_batches_tracked) == 7
    with pytest.raises(ValueError, match="running_var"):
        apply_buffer_updates(model, [("running_var", torch.ones(4))])


def test_validate_hf_model_output(tmp_path):
    from verl.model_merger.output_validation import validate_hf_model_output

    with pytest.raises(RuntimeError, match="config.json is missing.*no complete weights"):
        validate_hf_model_output(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(
        {"weight_map": {"a": "model-1.safetensors", "b": "model-2.safetensors"}}))
    (tmp_path / "model-1.safetensors").write_bytes(b"x")
    with pytest.raises(RuntimeError, match=r"missing or empty shards: \['model-2.safetensors'\]"):
        validate_hf_model_output(tmp_path)
    (tmp_path / "model-2.safetensors").write_bytes(b"x")
    validate_hf_model_output(tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "../elsewhere"}}))
    with pytest.raises(RuntimeError, match="outside the folder"):
        validate_hf_model_output(tmp_path)


def test_a_real_merge_validates(tmp_path):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from verl.model_merger.output_validation import validate_hf_model_output

    Qwen2ForCausalLM(Qwen2Config(vocab_size=32, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                                 num_attention_heads=2, num_key_value_heads=1)).save_pretrained(tmp_path)
    validate_hf_model_output(tmp_path)


def test_token_ids_and_transformers_helpers():
    import transformers

    from verl.utils.tokenizer import normalize_token_ids
    from verl.utils.transformers_compat import get_auto_model_for_vision2seq, is_transformers_version_in_range
    from verl.workers.rollout.utils import get_max_position_embeddings

    assert normalize_token_ids([[5, 6]]) == [5, 6] == normalize_token_ids({"input_ids": torch.tensor([5, 6])})
    assert normalize_token_ids((torch.tensor(1), 2)) == [1, 2]
    with pytest.raises(TypeError, match="not an integer"):
        normalize_token_ids(["a"])
    assert is_transformers_version_in_range(min_version="4.0", max_version=None)
    assert not is_transformers_version_in_range(max_version="1.0")
    assert get_auto_model_for_vision2seq() in (getattr(transformers, "AutoModelForImageTextToText", None),
                                               getattr(transformers, "AutoModelForVision2Seq", None))

    class VL:
        text_config = type("T", (), {"max_position_embeddings": 4096})()

    assert get_max_position_embeddings(VL()) == 4096
    with pytest.raises(ValueError, match="max_position_embeddings"):
        get_max_position_embeddings(object())


@pytest.mark.parametrize("module,name,feature", [
    ("verl.workers.rollout.llm_server", "LLMServerManager", "LLM server"),
    ("verl.workers.rollout.sglang_rollout.utils", "normalize_peft_config_for_sglang", "SGLang"),
    ("verl.workers.rollout.vllm_rollout.vllm_rollout", "ServerAdapter", "vLLM HTTP server"),
    ("verl.utils.tokenizer.chat_template", "apply_chat_template", "chat-template"),
    ("verl.utils.tokenizer.tokenizer", "build_multimodal_processor_inputs", "multimodal"),
    ("verl.utils.transformers_compat", "drop_tied_target_keys", "engine-based"),
    ("verl.utils.reward_score.rlla", "compute_score", "RLLA"),
    ("verl.trainer.ppo.padding_utils", "upsample_batch_to_divisible_size", "padding"),
])
def test_unsupported_names_say_which_feature(module, name, feature):
    mod = importlib.import_module(module)
    with pytest.raises(UnsupportedFeatureError, match=feature) as err:
        getattr(mod, name)
    assert isinstance(err.value, NotImplementedError) and f"{module}.{name}" in str(err.value)
