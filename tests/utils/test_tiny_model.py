"""The tiny local model loads through the ordinary transformers entry points."""
from transformers import AutoModelForCausalLM, AutoTokenizer

from verl.utils.tiny_model import build_tiny_model_dir


def test_tiny_model_round_trip(tmp_path):
    path = build_tiny_model_dir(str(tmp_path / "m"), hidden_size=32, num_layers=1)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    assert model.config.vocab_size == len(tok)
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    text = tok.apply_chat_template([{"role": "user", "content": "What is 7 + 5?"}],
                                   add_generation_prompt=True, tokenize=False)
    assert text.endswith("<|im_start|>assistant\n")
    ids = tok(text)["input_ids"]
    assert tok.decode(ids) == text  # byte-level BPE: lossless for any text


def test_same_seed_same_weights(tmp_path):
    a = AutoModelForCausalLM.from_pretrained(build_tiny_model_dir(str(tmp_path / "a"), seed=3))
    b = AutoModelForCausalLM.from_pretrained(build_tiny_model_dir(str(tmp_path / "b"), seed=3))
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert (pa == pb).all()
