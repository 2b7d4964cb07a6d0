"""Build a tiny Qwen2.5-VL-architecture model, its tokenizer and its processor on local disk.

The vision-language counterpart of `verl.utils.tiny_model`: tests and the demo train a model made here,
loaded through the ordinary `AutoProcessor` / `AutoModelForImageTextToText` calls like a hub checkpoint.
The vision tower is one block wide enough for 14-pixel patches; a 56x56 image becomes 16 patches and,
after the 2x2 merge, 4 image tokens in the prompt.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterable

from verl.utils.tiny_model import SPECIAL_TOKENS, build_tokenizer

VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]

# ChatML whose message content is a string or a list of {"type": "text"|"image"} parts; each image part
# becomes the vision span the processor widens to the image's token count.
VL_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def build_tiny_vl_model_dir(
    out_dir: str,
    corpus_texts: Iterable[str] | None = None,
    *,
    vocab_size: int = 512,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    vision_hidden_size: int = 32,
    vision_depth: int = 1,
    vision_heads: int = 2,
    vision_intermediate_size: int | None = None,
    mrope_section: list[int] | None = None,
    max_pixels: int = 224 * 224,
    max_position_embeddings: int = 2048,
    seed: int = 0,
    tokenizer_dir: str | None = None,
    init_device: str = "cpu",
    save_dtype: str = "float32",
) -> str:
    """Write tokenizer, processor, config and random weights of a Qwen2.5-VL model; return `out_dir`.

    Small by default; `QWEN25_VL_3B` holds the keyword arguments of Qwen2.5-VL-3B's shape (random weights)
    for GPU runs that need the real model's size. `tokenizer_dir` (a Qwen tokenizer folder, which has the
    vision tokens) replaces the trained small tokenizer, the vocabulary then at least `vocab_size`;
    `init_device="cuda"` draws a 3B model's weights in seconds, `save_dtype` halves its files."""
    import torch
    from transformers import (GenerationConfig, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration,
                              Qwen2_5_VLProcessor)
    try:   # transformers 5: the PIL-backed processor (no torchvision)
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil as ImageProcessor
    except ImportError:   # transformers 4.x: its slow processor is the PIL/numpy one
        from transformers import Qwen2VLImageProcessor as ImageProcessor

    os.makedirs(out_dir, exist_ok=True)
    # ChatML plus Qwen's vision tokens as special tokens; saved with the processor below
    if tokenizer_dir is None:
        tokenizer = build_tokenizer(None, corpus_texts, vocab_size, special_tokens=SPECIAL_TOKENS + VISION_TOKENS,
                                    chat_template=VL_CHAT_TEMPLATE)
        vocab_size = len(tokenizer)
    else:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        tokenizer.chat_template = VL_CHAT_TEMPLATE
        vocab_size = max(vocab_size, len(tokenizer))
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in VISION_TOKENS}
    head_dim = hidden_size // num_heads
    # mrope splits each head's rotary half into (temporal, height, width) sections.
    quarter = head_dim // 2 // 4
    sections = mrope_section or [head_dim // 2 - 2 * quarter, quarter, quarter]
    config = Qwen2_5_VLConfig(
        text_config={
            "vocab_size": vocab_size, "hidden_size": hidden_size, "intermediate_size": intermediate_size,
            "num_hidden_layers": num_layers, "num_attention_heads": num_heads,
            "num_key_value_heads": num_kv_heads, "max_position_embeddings": max_position_embeddings,
            # hub configs' (transformers 4.x) form, which transformers 5 reads as its rope_parameters
            "rope_theta": 10000.0, "rope_scaling": {"type": "mrope", "mrope_section": sections},
            "eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id,
            "bos_token_id": None, "tie_word_embeddings": True,
        },
        vision_config={
            "depth": vision_depth, "hidden_size": vision_hidden_size, "intermediate_size": vision_intermediate_size or 2 * vision_hidden_size,
            "num_heads": vision_heads, "out_hidden_size": hidden_size, "patch_size": 14, "spatial_merge_size": 2,
            "temporal_patch_size": 2, "window_size": 112,
            "fullatt_block_indexes": list(range(min(vision_depth, 8) - 1, vision_depth, 8)),
        },
        image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=True,
    )
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        with torch.device(init_device):
            model = Qwen2_5_VLForConditionalGeneration(config)
    finally:
        torch.random.set_rng_state(generator_state)
    model.to(getattr(torch, save_dtype)).save_pretrained(out_dir)
    # By default small images stay small: at most 16x16 patches (64 image tokens) per image.
    image_processor = ImageProcessor(min_pixels=56 * 56, max_pixels=max_pixels, patch_size=14,
                                               temporal_patch_size=2, merge_size=2)
    # The processor's own files, written part by part: transformers builds a Qwen2_5_VLProcessor only with
    # torchvision installed (see verl.utils.tokenizer.hf_processor), and these tests must not need it.
    tokenizer.save_pretrained(out_dir)
    image_processor.save_pretrained(out_dir)
    with open(os.path.join(out_dir, "chat_template.jinja"), "w") as f:
        f.write(VL_CHAT_TEMPLATE)
    with open(os.path.join(out_dir, "processor_config.json"), "w") as f:
        json.dump({"processor_class": Qwen2_5_VLProcessor.__name__}, f)
    GenerationConfig(eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id).save_pretrained(out_dir)
    with open(os.path.join(out_dir, "tiny_model.json"), "w") as f:
        json.dump({"built_by": "tiny_vl_model", "seed": seed}, f)
    return out_dir


# Qwen2.5-VL-3B-Instruct's shape (its config.json); the vocabulary is the tokenizer's, at least 151,936 (Qwen's).
QWEN25_VL_3B = {"vocab_size": 151936, "hidden_size": 2048, "num_layers": 36, "num_heads": 16, "num_kv_heads": 2, "intermediate_size": 11008,
                "vision_hidden_size": 1280, "vision_depth": 32, "vision_heads": 16, "vision_intermediate_size": 3420,
                "mrope_section": [16, 24, 24], "max_position_embeddings": 128000, "max_pixels": 12845056}


def tiny_images(count: int, size: int = 56, seed: int = 0) -> list:
    """`count` PIL RGB images of random blocks, different from one another."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    images = []
    for _ in range(count):
        blocks = rng.integers(0, 256, size=(size // 14, size // 14, 3), dtype=np.uint8)
        images.append(Image.fromarray(np.kron(blocks, np.ones((14, 14, 1), dtype=np.uint8))))
    return images


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="Build a Qwen2.5-VL-architecture model + tokenizer + processor.")
    parser.add_argument("out_dir")
    parser.add_argument("--shape", choices=["tiny", "qwen2.5-vl-3b"], default="tiny")
    parser.add_argument("--tokenizer", help="a Qwen tokenizer folder (e.g. .gpu-assets/tok) instead of a trained small one")
    parser.add_argument("--device", default="cpu", help="where the random weights are drawn (cuda: seconds for 3B)")
    parser.add_argument("--dtype", default="float32", help="the saved weights' dtype")
    args = parser.parse_args()
    shape = QWEN25_VL_3B if args.shape == "qwen2.5-vl-3b" else {}
    print(build_tiny_vl_model_dir(args.out_dir, **shape, tokenizer_dir=args.tokenizer, init_device=args.device,
                                  save_dtype=args.dtype))
