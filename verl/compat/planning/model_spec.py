"""A model's sizes, read from its config.json alone, so planning never loads weights."""
from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from verl.compat.planning.vision import VisionSpec

# model_type -> (bias on q/k/v, bias on o, per-head q/k norms); others follow `attention_bias`.
_ATTENTION_LAYOUT = {
    "qwen2": (True, False, False),
    "qwen2_vl": (True, False, False), "qwen2_vl_text": (True, False, False),
    "qwen2_5_vl": (True, False, False), "qwen2_5_vl_text": (True, False, False),
    "qwen3": (None, None, True),
}


# config.json fields of well-known models, for planning when the weights are not on this machine.
_QWEN2_5 = {"model_type": "qwen2", "vocab_size": 151936, "tie_word_embeddings": True, "max_position_embeddings": 32768}
BUILTIN_MODELS = {
    "qwen2.5-0.5b": {**_QWEN2_5, "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
                     "num_attention_heads": 14, "num_key_value_heads": 2},
    "qwen2.5-1.5b": {**_QWEN2_5, "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
                     "num_attention_heads": 12, "num_key_value_heads": 2},
    "qwen2.5-3b": {**_QWEN2_5, "hidden_size": 2048, "intermediate_size": 11008, "num_hidden_layers": 36,
                   "num_attention_heads": 16, "num_key_value_heads": 2},
    "qwen2.5-7b": {**_QWEN2_5, "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
                   "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
                   "tie_word_embeddings": False},
}


@dataclass(frozen=True)
class ModelSpec:
    """The numbers the memory model needs about a decoder-only transformer."""

    num_params: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    max_position_embeddings: int
    model_type: str = ""
    vision: VisionSpec | None = None   # a vision-language model's vision tower (its params are in num_params)

    @property
    def lm_head_params(self) -> int:
        """Parameters the untied output projection adds (0 when tied to the embedding)."""
        return 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size

    @property
    def critic_params(self) -> int:
        """A value model: same trunk, the vocab head replaced by a scalar head (weight + bias)."""
        return self.num_params - self.lm_head_params + self.hidden_size + 1

    def linear_shapes(self) -> list[tuple[int, int]]:
        """(in, out) of one decoder layer's linear layers: q, k, v, o, gate, up, down."""
        h, q, kv, inter = self.hidden_size, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim, \
            self.intermediate_size
        return [(h, q), (h, kv), (h, kv), (q, h), (h, inter), (h, inter), (inter, h)]

    @property
    def decoder_linear_params(self) -> int:
        """Weights of every decoder layer's linear layers: what a 4-bit base stores in 4 bits (the
        embeddings, the output projection and the norms stay in half precision)."""
        return self.num_layers * sum(i * o for i, o in self.linear_shapes())

    def lora_params(self, rank: int) -> int:
        """Adapter parameters of rank `rank` on every decoder linear layer (peft's `all-linear` target,
        upstream's default and the largest usual choice): r x (in + out) per layer."""
        return self.num_layers * rank * sum(i + o for i, o in self.linear_shapes())

    @classmethod
    def from_hf_config(cls, hf_config: Any) -> ModelSpec:
        """From a transformers `PretrainedConfig` or a config.json dict."""
        get = hf_config.get if isinstance(hf_config, Mapping) else (lambda k, d=None: getattr(hf_config, k, d))
        vision_cfg = get("vision_config")
        if vision_cfg is not None:   # a VL model: the LM (nested or flat, as hub configs are) plus its tower
            text = get("text_config") if get("text_config") is not None and get("hidden_size") is None else {
                k: v for k, v in (hf_config.items() if isinstance(hf_config, Mapping) else hf_config.to_dict().items())
                if k != "vision_config"}
            lm = cls.from_hf_config(text)
            vget = vision_cfg.get if isinstance(vision_cfg, Mapping) else (lambda k, d=None: getattr(vision_cfg, k, d))
            tower = VisionSpec.from_hf_config(vget)
            return replace(lm, num_params=lm.num_params + tower.params, vision=tower)
        if get("text_config") is not None and get("hidden_size") is None:
            return cls.from_hf_config(get("text_config"))   # multimodal wrapper: plan the LM
        hidden = int(get("hidden_size"))
        heads = int(get("num_attention_heads"))
        kv_heads = int(get("num_key_value_heads") or heads)
        head_dim = int(get("head_dim") or hidden // heads)
        layers = int(get("num_hidden_layers"))
        inter = int(get("intermediate_size"))
        vocab = int(get("vocab_size"))
        tied = bool(get("tie_word_embeddings", False))
        model_type = str(get("model_type") or "")
        qkv_bias, o_bias, qk_norm = _ATTENTION_LAYOUT.get(model_type, (None, None, False))
        attention_bias = bool(get("attention_bias", False))
        qkv_bias = attention_bias if qkv_bias is None else qkv_bias
        o_bias = attention_bias if o_bias is None else o_bias
        mlp_bias = bool(get("mlp_bias", False))

        q, kv = heads * head_dim, kv_heads * head_dim
        attn = hidden * (q + 2 * kv) + q * hidden
        attn += (q + 2 * kv) * qkv_bias + hidden * o_bias + 2 * head_dim * qk_norm
        mlp = 3 * hidden * inter + (2 * inter + hidden) * mlp_bias
        per_layer = attn + mlp + 2 * hidden                     # two RMSNorm weights
        total = vocab * hidden + layers * per_layer + hidden    # embedding, layers, final norm
        total += 0 if tied else vocab * hidden
        return cls(num_params=total, hidden_size=hidden, num_layers=layers, num_heads=heads,
                   num_kv_heads=kv_heads, head_dim=head_dim, intermediate_size=inter,
                   vocab_size=vocab, tie_word_embeddings=tied,
                   max_position_embeddings=int(get("max_position_embeddings") or 0),
                   model_type=model_type)

    @classmethod
    def from_pretrained(cls, path: str) -> ModelSpec:
        """Read the model's config.json: `path` is a local folder, the config file itself, an
        `hdfs://` folder or a hub id (cache first; only config.json is fetched, never weights)."""
        from verl.utils.fs import resolve_model_path

        path = os.path.expanduser(str(path))
        try:
            config_file = resolve_model_path(path, filename=None if path.endswith(".json") else "config.json")
        except Exception as err:   # noqa: BLE001 - hub, network and copy errors all mean "no config here"
            raise FileNotFoundError(
                f"The planner needs the model's config.json to size memory, but could not read it for "
                f"model path '{path}' ({type(err).__name__}: {err}). Point actor_rollout_ref.model.path "
                f"(or critic.model.path) at a local folder holding config.json, or at a hub id that is "
                f"in the Hugging Face cache or can be downloaded.") from err
        if not os.path.isfile(config_file):
            raise FileNotFoundError(
                f"The planner needs the model's config.json to size memory, but there is none at "
                f"'{config_file}' (model path given: '{path}'). Point actor_rollout_ref.model.path "
                f"(or critic.model.path) at a folder holding config.json.")
        with open(config_file) as f:
            return cls.from_hf_config(json.load(f))

    def to_dict(self) -> dict:
        return asdict(self)
