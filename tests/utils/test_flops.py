"""MFU's FLOP counts read a vision-language config's language model."""
from transformers import Qwen2Config, Qwen2_5_VLConfig

from verl.utils.flops import matmul_params, training_flops


def test_a_vision_language_config_counts_its_language_model():
    text = dict(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                num_attention_heads=4, num_key_value_heads=2)
    vl = Qwen2_5_VLConfig(text_config=text, vision_config={"depth": 1, "hidden_size": 32, "out_hidden_size": 64})
    plain = Qwen2Config(**text)
    assert matmul_params(vl) == matmul_params(plain) == 3 * (64 * 16 * 8 + 64 * 64 + 3 * 64 * 128) + 1000 * 64
    assert training_flops(vl, [10, 20]) == training_flops(plain, [10, 20])
