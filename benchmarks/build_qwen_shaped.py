"""Write a Qwen2.5-shaped model (0.5B by default; `--shape` for 1.5B, 3B, 7B) with random weights and the real
Qwen tokenizer to a folder.

No weights can be downloaded here, so the GPU benchmarks train this stand-in: the real vocabulary and
shapes give realistic token counts and memory, while rewards on GSM8K stay near 0 (random weights).

    python benchmarks/build_qwen_shaped.py OUT_DIR --tokenizer ../shared/data/qwen-tokenizer [--layers 24]
    python benchmarks/build_qwen_shaped.py OUT_DIR --tokenizer TOK --shape qwen2.5-7b --init-device cuda \
        --save-dtype bfloat16       # 7B in ~1 min on a GPU (initialised there, saved as bf16 safetensors)

`--layers 2 --hidden 64` gives a CPU-sized model with the same vocabulary and tokenizer (the cold-start
benchmark uses it on CPU: start-up work that scales with the vocabulary or the data stays realistic).
"""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from verl.compat.model_spec import BUILTIN_MODELS

# The real 0.5B checkpoint's shape plus the two numerics fields its config.json sets (rollout_speed.py uses it).
QWEN25_05B = {**{k: v for k, v in BUILTIN_MODELS["qwen2.5-0.5b"].items() if k != "model_type"},
              "rope_theta": 1000000.0, "rms_norm_eps": 1e-6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--tokenizer", required=True, help="folder with tokenizer.json + tokenizer_config.json")
    parser.add_argument("--shape", default="qwen2.5-0.5b", choices=sorted(BUILTIN_MODELS),
                        help="which real checkpoint's shape (verl.compat.model_spec.BUILTIN_MODELS)")
    parser.add_argument("--init-device", default="cpu", help="where the random weights are drawn (cuda: fast)")
    parser.add_argument("--save-dtype", default="float32", help="dtype of the saved weights (float32, bfloat16)")
    parser.add_argument("--layers", type=int, default=None, help="decoder layers (default: the shape's)")
    parser.add_argument("--hidden", type=int, default=None,
                        help="hidden size (heads, KV heads and MLP width shrink with it); default: the real one")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(Path(args.tokenizer) / name, out / name)
    tokenizer = AutoTokenizer.from_pretrained(out)
    base = {**{k: v for k, v in BUILTIN_MODELS[args.shape].items() if k != "model_type"},
            "rope_theta": QWEN25_05B["rope_theta"], "rms_norm_eps": QWEN25_05B["rms_norm_eps"]}
    shape = {**base, "num_hidden_layers": args.layers or base["num_hidden_layers"]}
    if args.hidden is not None:
        head_dim = base["hidden_size"] // base["num_attention_heads"]
        heads = max(2, args.hidden // head_dim)
        shape.update(hidden_size=args.hidden, num_attention_heads=heads, num_key_value_heads=max(1, heads // 2),
                     intermediate_size=4 * args.hidden)
    config = Qwen2Config(**shape,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(args.seed)
    with torch.device(args.init_device):
        model = Qwen2ForCausalLM(config)
    model.to(getattr(torch, args.save_dtype)).save_pretrained(out)
    print(f"{out}: {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M params, vocab {config.vocab_size}")


if __name__ == "__main__":
    main()
