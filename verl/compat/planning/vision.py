"""The vision tower of a vision-language model (Qwen2/2.5-VL layout): its size, and the plan's rules for it.

A VL checkpoint is a vision transformer whose merged patch features replace the image tokens of the
prompt, then the usual decoder. For planning that means:
- weights: the tower's parameters are part of the model's (`ModelSpec.num_params` counts them), trained
  with the rest unless `actor.freeze_vision_tower`;
- sequence length: each image becomes `patches / merge^2` prompt tokens, already inside
  `data.max_prompt_length` (the data set counts the processor's expanded tokens);
- activations: the tower runs over the patches (merge^2 per image token) at its own width;
- positions: (4, seq) multimodal rotary positions, which the packed (remove-padding) path does not carry,
  and the built-in engine's static decoder does not take (it calls the model's own forward for VL).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from verl.compat.planning import settings
from verl.compat.planning.settings import AUTO

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

    @classmethod
    def from_hf_config(cls, get) -> VisionSpec:
        """From a vision_config read through `get(key, default)`; Qwen2.5-VL (hidden_size,
        intermediate_size) and Qwen2-VL (embed_dim, mlp_ratio) spellings."""
        hidden = int(get("embed_dim", None) or get("hidden_size"))
        inter = int(get("intermediate_size", None) or hidden * float(get("mlp_ratio", 4)))
        depth = int(get("depth"))
        merge = int(get("spatial_merge_size", 2))
        out = int(get("out_hidden_size", None) or get("hidden_size"))
        patch_in = int(get("in_channels", None) or get("in_chans", 3)) * int(get("temporal_patch_size", 2)) \
            * int(get("patch_size", 14)) ** 2
        gated = get("hidden_act", "silu") != "quick_gelu"    # Qwen2.5-VL: gate/up/down; Qwen2-VL: fc1/fc2
        mlp = (3 if gated else 2) * hidden * inter + (2 * inter if gated else inter) + hidden
        block = 2 * hidden + (3 * hidden * hidden + 3 * hidden) + (hidden * hidden + hidden) + mlp
        wide = hidden * merge * merge
        merger = hidden + wide * wide + wide + wide * out + out
        return cls(params=patch_in * hidden + depth * block + merger, hidden_size=hidden, depth=depth,
                   intermediate_size=inter, patches_per_token=merge * merge)

    def activation_bytes(self, image_tokens: int, dtype_bytes: int) -> int:
        """Activations one forward+backward keeps over `image_tokens` image tokens (no checkpointing):
        per patch and block the residual, q/k/v, attention output and the gated MLP's three tensors."""
        patches = image_tokens * self.patches_per_token
        per_block = 6 * self.hidden_size + 3 * self.intermediate_size
        return patches * self.depth * per_block * dtype_bytes


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
    act_gb = vision.activation_bytes(prompt_length, _bytes(actor.compute_dtype)) / 2**30
    decider.note("vision.memory", round(vision.params / 1e6, 2),
           f"{vision.params / 1e6:.1f}M tower parameters counted in the model's weights; image tokens count in "
           f"data.max_prompt_length; a {prompt_length}-token prompt of image tokens holds {act_gb:.3f} GiB of "
           "tower activations per sequence in an update micro-batch (not in the fit's activation term)")
    return out


def decide_vision_rollout(decider, rollout, vision: VisionSpec | None):
    """The built-in engine generates a VL model through the model's own forward (the pixels enter at the
    prefill), so its static decoder, and with it CUDA graphs and the compiled decode step, are off."""
    if vision is None or rollout.name != "hf":
        return rollout
    why = ("vision-language model: the built-in engine calls the model's own forward (image features at the "
           "prefill), not the static decoder")
    decider.note("rollout.cuda_graphs", False, why)
    decider.note("rollout.compile_backend", None, why)
    return replace(rollout, cuda_graphs=False, compile_backend=None)


def _bytes(dtype: str) -> int:
    return 4 if dtype == "float32" else 2
