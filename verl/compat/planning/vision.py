"""The vision tower of a vision-language model (Qwen2/2.5-VL layout): its size, and the plan's rules for it.

A VL checkpoint is a vision transformer whose merged patch features replace the image tokens of the
prompt, then the usual decoder. For planning that means:
- weights: the tower's parameters are part of the model's (`ModelSpec.num_params` counts them), trained
  with the rest unless `actor.freeze_vision_tower`;
- sequence length: each image becomes `patches / merge^2` prompt tokens, already inside
  `data.max_prompt_length` (the data set counts the processor's expanded tokens);
- activations: the tower runs over the patches (merge^2 per image token) at its own width;
- positions: (4, seq) multimodal rotary positions, which the packed (remove-padding) path does not carry;
  the built-in engine prefills through the model's own forward (pixels, these positions) and decodes
  with its static decoder (generated tokens are text), so its CUDA graph and compile rules are the text ones.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from verl.compat.planning import settings
from verl.compat.planning.settings import AUTO

BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}   # element size of each compute/storage dtype

# Attention the vision tower's block-diagonal (per image / window) attention runs with in transformers:
# these take its cu_seqlens boundaries. The fork's own registrations (xformers, torch_varlen) are not
# checked against the tower, so VL roles are planned on one of these.
VISION_ATTENTION = ("flash_attention_2", "sdpa", "eager")


@dataclass(frozen=True)
class VisionSpec:
    """The numbers of a Qwen-VL-style vision tower the plan needs."""

    params: int
    hidden_size: int
    depth: int
    intermediate_size: int
    patches_per_token: int   # spatial_merge_size^2: patches merged into one image token
    num_heads: int = 16
    patch_features: int = 1176       # pixel values per patch: channels x temporal patch x patch^2
    out_hidden_size: int = 0         # width of a merged image token (the decoder's hidden size)
    window_patches: int = 0          # patches per attention window (0: every block attends over its image)
    full_attention_blocks: int = 0   # blocks attending over the whole image (all of them without windows)
    gated: bool = True               # gate/up/down MLP (Qwen2.5-VL); fc1/fc2 (Qwen2-VL)

    @classmethod
    def from_hf_config(cls, get) -> VisionSpec:
        """From a vision_config read through `get(key, default)`; Qwen2.5-VL (hidden_size,
        intermediate_size) and Qwen2-VL (embed_dim, mlp_ratio) spellings."""
        hidden = int(get("embed_dim", None) or get("hidden_size"))
        inter = int(get("intermediate_size", None) or hidden * float(get("mlp_ratio", 4)))
        depth = int(get("depth"))
        merge = int(get("spatial_merge_size", 2))
        out = int(get("out_hidden_size", None) or get("hidden_size"))
        patch = int(get("patch_size", 14))
        patch_in = int(get("in_channels", None) or get("in_chans", 3)) * int(get("temporal_patch_size", 2)) * patch ** 2
        gated = get("hidden_act", "silu") != "quick_gelu"    # Qwen2.5-VL: gate/up/down; Qwen2-VL: fc1/fc2
        mlp = (3 if gated else 2) * hidden * inter + (2 * inter if gated else inter) + hidden
        block = 2 * hidden + (3 * hidden * hidden + 3 * hidden) + (hidden * hidden + hidden) + mlp
        wide = hidden * merge * merge
        merger = hidden + wide * wide + wide + wide * out + out
        full = get("fullatt_block_indexes", None)
        window = int(get("window_size", 0) or 0) // patch if full is not None else 0
        return cls(params=patch_in * hidden + depth * block + merger, hidden_size=hidden, depth=depth,
                   intermediate_size=inter, patches_per_token=merge * merge, num_heads=int(get("num_heads", 16)),
                   patch_features=patch_in, out_hidden_size=out, window_patches=window * window,
                   full_attention_blocks=len(full) if window else depth, gated=gated)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


def _attention_chunks(v: VisionSpec, image_patches: int) -> list[tuple[int, int]]:
    """(blocks, patches each attends over): full-attention blocks over one image, window blocks over a window."""
    windowed = v.depth - v.full_attention_blocks
    return [(v.full_attention_blocks, image_patches)] + ([(windowed, min(v.window_patches, image_patches))]
                                                         if windowed else [])


def block_saved_bytes(v: VisionSpec, compute: str, weights: str, attn: str, chunk: int) -> float:
    """Bytes one vision block saves for backward per patch, as transformers runs Qwen2.5-VL's block
    (docs/compat.md, "Vision tower"). Each RMSNorm keeps a float32 copy of its input, its normalised input
    and its output (4H + 2cH); with weights in another dtype than the compute dtype the norm's output is
    cast once more for the second MLP linear that reads it (autocast casts per use). Attention: the qkv
    output, kept whole by v's view (3cH), q and k after the rotary embedding (2cH), the output
    projection's input (cH), and sdpa/flash's output and log-sum-exp, or eager's float32 softmax (and
    its cast to a half compute dtype) over `chunk` patches. MLP: gate, activation, up, product (4cI; fc1/fc2: 3cI)."""
    c, h, heads = BYTES[compute], v.hidden_size, v.num_heads
    norms = 2 * (4 * h + 2 * c * h + 4) + (c * h if weights != compute else 0)
    scores = heads * chunk * (4 + (c if c < 4 else 0)) if attn == "eager" else c * h + 4 * heads
    mlp = (4 if v.gated else 3) * c * v.intermediate_size
    return norms + 6 * c * h + scores + mlp


def _around_blocks(v: VisionSpec, compute: str) -> float:
    """Per patch, outside the blocks and alive through the tower's backward: the patch embedding's cast
    of the pixels (a half compute dtype), the rotary tables (float32 cos, sin), and the patch merger
    (its norm as above; its first linear's output and GELU's; the merged output)."""
    c, h = BYTES[compute], v.hidden_size
    stem = v.patch_features * c if c < 4 else 0
    merger = 4 * h + 4 + 4 * c * h + c * v.out_hidden_size / v.patches_per_token
    return stem + 2 * 4 * v.head_dim + merger


def tower_saved_bytes(v: VisionSpec, compute: str, weights: str, attn: str, patches: int, image_patches: int,
                      checkpointed: bool = False) -> float:
    """What a trained tower keeps for backward over `patches` patches (images of up to `image_patches`):
    every block's saved tensors, or under gradient checkpointing (which covers the tower's blocks too)
    only each block's input (cH)."""
    if checkpointed:
        blocks = v.depth * BYTES[compute] * v.hidden_size * patches
    else:
        blocks = sum(n * block_saved_bytes(v, compute, weights, attn, chunk) * patches
                     for n, chunk in _attention_chunks(v, image_patches))
    return blocks + _around_blocks(v, compute) * patches


def tower_forward_bytes(v: VisionSpec, compute: str, weights: str, attn: str, patches: int,
                        image_patches: int) -> float:
    """The most a forward without gradients holds at once over `patches` patches: inside one block,
    around the rotary embedding (block input, normalised copy, qkv, q and k in float32 for a half
    compute dtype, the rotated q, k's two products and rotate-half) or in the MLP (block input, residual
    after attention, normalised copy and its casts, three intermediates); eager attention adds one
    image's float32 and cast scores; the rotary tables and merged output beside."""
    c, h = BYTES[compute], v.hidden_size
    norm = max(c, BYTES[weights])
    rotary = c * h + norm * h + 3 * c * h + (8 * h if c < 4 else 0) + 16 * h
    mlp = 2 * c * h + norm * h + (2 * c * h if norm != c else 0) + (3 if v.gated else 2) * c * v.intermediate_size
    per_patch = max(rotary, mlp) + 2 * 4 * v.head_dim + c * v.out_hidden_size / v.patches_per_token
    scores = v.num_heads * image_patches ** 2 * (4 + 2 * c) if attn == "eager" else 0
    return per_patch * patches + scores


def decide_vision(decider, config: Any, roles: dict, vision: VisionSpec | None, prompt_length: int) -> dict:
    """The VL rules over the decided roles (unchanged for a text-only model); each decision is noted."""
    if vision is None:
        return roles
    if "critic" in roles:
        from verl.compat.planning.decider import PlanError

        raise PlanError("a critic (value head) on a vision-language model is not built; use a critic-free "
                        "estimator: algorithm.adv_estimator=grpo (or rloo, reinforce_plus_plus, remax)")
    arr = "actor_rollout_ref"
    out = {}
    for name, role in roles.items():
        prefix = "critic.model" if name == "critic" else f"{arr}.model"
        attn = role.attn_implementation
        if attn not in VISION_ATTENTION:
            asked = settings.get(config, f"{prefix}.attn_implementation")
            why = f"the vision tower's per-image attention is planned on {'/'.join(VISION_ATTENTION)} only"
            attn = (decider.note(f"{name}.attn_implementation", "sdpa", f"vision-language model: {why}") if asked is AUTO
                    else decider.adapt(f"{name}.attn_implementation", f"{prefix}.attn_implementation", attn, "sdpa", why))
        rmpad = role.use_remove_padding
        if rmpad:
            why = "packed rows carry (batch, seq) positions, and a VL model needs (4, seq) multimodal ones"
            rmpad = (decider.note(f"{name}.use_remove_padding", False, f"vision-language model: {why}")
                     if settings.flag(settings.get(config, f"{prefix}.use_remove_padding")) is AUTO
                     else decider.adapt(f"{name}.use_remove_padding", f"{prefix}.use_remove_padding", True, False, why))
        out[name] = replace(role, attn_implementation=attn, use_remove_padding=rmpad)
    actor = out["actor"]
    decider.note("vision.dtype", actor.compute_dtype,
           f"the vision tower computes in the actor's compute dtype ({actor.compute_dtype}) with the decoder, "
           f"its weights stored in {actor.param_dtype}; attention {actor.attn_implementation}")
    frozen = bool(settings.flag(settings.get(config, f"{arr}.actor.freeze_vision_tower", False)))
    decider.note("vision.frozen", frozen,
           "actor.freeze_vision_tower=True: the tower's weights get no gradients or optimizer state" if frozen
           else "the tower trains with the decoder (actor.freeze_vision_tower=False, upstream's default)")
    decider.note("vision.memory", round(vision.params / 1e6, 2), _memory_reason(vision, actor, frozen, prompt_length))
    out["actor"] = replace(actor, vision_frozen=frozen)
    return out


def _memory_reason(vision: VisionSpec, actor, frozen: bool, prompt_length: int) -> str:
    """The tower's memory per sequence whose prompt is all image tokens (the most `data.max_prompt_length`
    allows: one image of prompt_length x merge^2 patches)."""
    patches = prompt_length * vision.patches_per_token
    c, attn = actor.compute_dtype, actor.attn_implementation
    saved = tower_saved_bytes(vision, c, c, attn, patches, patches) / 2**30
    ckpt = tower_saved_bytes(vision, c, c, attn, patches, patches, checkpointed=True) / 2**30
    forward = tower_forward_bytes(vision, c, c, attn, patches, patches) / 2**30
    kept = ("frozen (actor.freeze_vision_tower): nothing kept for backward" if frozen else
            f"an update keeps {saved:.3f} GiB of tower activations for backward ({ckpt:.3f} GiB checkpointed)")
    return (f"{vision.params / 1e6:.1f}M tower parameters counted in the model's weights; image tokens count in "
            f"data.max_prompt_length, which bounds them: up to {prompt_length} a sequence ({patches} patches); "
            f"per such sequence {kept}, a forward without gradients holds {forward:.3f} GiB at once; the fit "
            "counts these in every phase that runs the tower (vision.activations)")
