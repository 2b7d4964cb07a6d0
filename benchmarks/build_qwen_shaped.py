"""Write a Qwen2.5-0.5B-shaped model with random weights and the real Qwen tokenizer to a folder.

No weights can be downloaded here, so the GPU benchmarks train this stand-in: the real vocabulary and
shapes give realistic token counts and memory, while rewards on GSM8K stay near 0 (random weights).

    python benchmarks/build_qwen_shaped.py OUT_DIR --tokenizer ../shared/data/qwen-tokenizer [--layers 24]

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

# The real checkpoint's shape plus the two numerics fields its config.json sets.
QWEN25_05B = {**{k: v for k, v in BUILTIN_MODELS["qwen2.5-0.5b"].items() if k != "model_type"},
              "rope_theta": 1000000.0, "rms_norm_eps": 1e-6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--tokenizer", required=True, help="folder with tokenizer.json + tokenizer_config.json")
    parser.add_argument("--layers", type=int, default=QWEN25_05B["num_hidden_layers"])
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
    shape = {**QWEN25_05B, "num_hidden_layers": args.layers}
    if args.hidden is not None:
        head_dim = QWEN25_05B["hidden_size"] // QWEN25_05B["num_attention_heads"]
        heads = max(2, args.hidden // head_dim)
        shape.update(hidden_size=args.hidden, num_attention_heads=heads, num_key_value_heads=max(1, heads // 2),
                     intermediate_size=4 * args.hidden)
    config = Qwen2Config(**shape,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(args.seed)
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(out)
    print(f"{out}: {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M params, vocab {config.vocab_size}")


if __name__ == "__main__":
    main()
