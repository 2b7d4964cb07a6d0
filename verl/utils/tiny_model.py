"""Build a tiny Qwen2-architecture model and its tokenizer on local disk.

Nothing can be downloaded in tests, CI or the demo, so they train models made here: a byte-level BPE
tokenizer trained on a few texts (any string still encodes, byte by byte) with a Qwen-style chat
template, and a randomly initialised `Qwen2ForCausalLM`. The directory loads with the ordinary
`AutoTokenizer.from_pretrained` / `AutoModelForCausalLM.from_pretrained` calls, exactly like a hub
checkpoint, so the loading code under test is the real one.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterable

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

# Qwen-style ChatML: each message is "<|im_start|>role\ncontent<|im_end|>\n".
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

DEFAULT_CORPUS = (
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May? Let's think step by step and output "
    "the final answer after \"####\". #### 72",
    "0 1 2 3 4 5 6 7 8 9 10 11 12 + - * / = the answer is",
)


def build_tokenizer(out_dir: str | None, corpus_texts: Iterable[str] | None = None, vocab_size: int = 512,
                    special_tokens: list[str] = SPECIAL_TOKENS, chat_template: str = CHAT_TEMPLATE):
    """Train a byte-level BPE tokenizer on `corpus_texts`; save it as a transformers tokenizer unless
    `out_dir` is None. The vision-language builder adds its vision tokens and template through the keywords."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    texts = list(corpus_texts) if corpus_texts is not None else list(DEFAULT_CORPUS)
    bpe = Tokenizer(models.BPE(unk_token=None))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(texts, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token=None,
        unk_token=None,
    )
    tokenizer.chat_template = chat_template
    if out_dir is not None:
        tokenizer.save_pretrained(out_dir)
    return tokenizer


def build_tiny_model_dir(
    out_dir: str,
    corpus_texts: Iterable[str] | None = None,
    *,
    vocab_size: int = 512,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    max_position_embeddings: int = 2048,
    tie_word_embeddings: bool = True,
    seed: int = 0,
    reward_head: bool = False,
) -> str:
    """Write tokenizer + config + random weights of a small Qwen2 model to `out_dir`; return it.

    The model's vocabulary is the tokenizer's real size (BPE may stop short of `vocab_size` on a small
    corpus), so no logit belongs to a token the tokenizer cannot produce. With `reward_head` it is a
    `Qwen2ForSequenceClassification` with one label: a reward model.
    """
    import torch
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM, Qwen2ForSequenceClassification

    os.makedirs(out_dir, exist_ok=True)
    tokenizer = build_tokenizer(out_dir, corpus_texts, vocab_size)
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **({"num_labels": 1} if reward_head else {}),
    )
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = (Qwen2ForSequenceClassification if reward_head else Qwen2ForCausalLM)(config)
    finally:
        torch.random.set_rng_state(generator_state)
    model.save_pretrained(out_dir)
    GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    ).save_pretrained(out_dir)
    with open(os.path.join(out_dir, "tiny_model.json"), "w") as f:
        json.dump({"built_by": "verl.utils.tiny_model", "seed": seed}, f)
    return out_dir


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Build a tiny local Qwen2 model + tokenizer.")
    parser.add_argument("out_dir")
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--num-layers", type=int, default=2)
    parser.add_argument("--vocab-size", type=int, default=512)
    args = parser.parse_args()
    print(build_tiny_model_dir(args.out_dir, hidden_size=args.hidden_size, num_layers=args.num_layers,
                               vocab_size=args.vocab_size))
