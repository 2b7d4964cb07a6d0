"""Build the HF models and tokenizer a worker trains, exactly as the compat plan says.

Dtype and attention kernel come from the role's `RolePlan`, never from the config or the device, so
the same code loads a P40 run (float32, sdpa) and an H200 run. `path` is a local folder, a hub id
or an `hdfs://` folder (see verl.utils.fs.resolve_model_path).
"""
from __future__ import annotations

import torch

from verl.compat import torch_dtype
from verl.compat.plan import RolePlan
from verl.utils.fs import resolve_model_path
from verl.utils.startup.transformers_import import transformers_import
from verl.utils.tokenizer import hf_tokenizer


def load_tokenizer(path: str, trust_remote_code: bool = False):
    """The tokenizer at `path` (resolved to a local folder), with a pad token: see
    verl.utils.tokenizer.hf_tokenizer."""
    return hf_tokenizer(resolve_model_path(path), trust_remote_code=trust_remote_code)


def is_vision_language(path: str) -> bool:
    """Whether the model folder's config.json describes a vision-language model (it has a vision_config)."""
    import json
    import os

    config_file = os.path.join(resolve_model_path(path), "config.json")
    if not os.path.isfile(config_file):
        return False
    with open(config_file) as f:
        return "vision_config" in json.load(f)


def load_processor(path: str, trust_remote_code: bool = False):
    """A vision-language model's processor with its `rope_index` (the model's multimodal position ids),
    or None for a text-only model. A VL model whose processor does not load is an error."""
    from verl.utils.dataset.vision_utils import rope_index_for
    from verl.utils.tokenizer import hf_processor

    if not is_vision_language(path):
        return None
    folder = resolve_model_path(path)
    processor = hf_processor(folder, trust_remote_code=trust_remote_code)
    if processor is None:
        raise ValueError(f"{path} is a vision-language model but its processor does not load (it needs "
                         "preprocessor_config.json beside the tokenizer)")
    processor.rope_index = rope_index_for(folder, trust_remote_code=trust_remote_code)
    if processor.rope_index is None:
        raise NotImplementedError(f"{path}: vision-language models without get_rope_index (Qwen2/2.5-VL style "
                                  "multimodal positions) are not supported")
    return processor


def import_model_code(path: str, trust_remote_code: bool = False) -> None:
    """Import what `build_model` will import for `path`, loading no weights: transformers' auto classes
    and the architecture's modelling module (which brings in transformers' modelling and generation
    utilities, seconds of imports). Workers run this on a thread while the driver is still
    reading the data sets. Only a local folder's config.json is read; a hub id, an `hdfs://` folder or
    remote code is left to `build_model`."""
    import importlib
    import json
    import os

    model_type = None
    config_file = os.path.join(path, "config.json")
    if not trust_remote_code and os.path.isfile(config_file):
        with open(config_file) as f:
            model_type = json.load(f).get("model_type")
    with transformers_import():
        import transformers.modeling_utils  # noqa: F401 - every model's base, with the loss table
        from transformers.models.auto import configuration_auto, modeling_auto  # noqa: F401
    if not model_type:
        return
    name = configuration_auto.model_type_to_module_name(model_type)
    try:   # after the block: some architectures import scipy at module level for themselves
        importlib.import_module(f"transformers.models.{name}.modeling_{name}")
    except ModuleNotFoundError:   # an architecture this transformers does not ship: build_model will say so
        pass


def build_model(
    path: str,
    role_plan: RolePlan,
    *,
    value_head: bool = False,
    trust_remote_code: bool = False,
    override_config: dict | None = None,
    train: bool = True,
    seed: int = 42,
) -> torch.nn.Module:
    """Load a causal LM (or, with `value_head`, a one-label token classifier for the critic).

    Weights are loaded in the plan's `param_dtype` with its `attn_implementation`; gradient
    checkpointing (non-reentrant, which composes with FSDP) is switched on where the plan asks.
    Weights that will never train (`train` False, or the base of a LoRA role) are stored in the plan's
    `frozen_dtype` where it sets one, and a LoRA base with `base_quantization` "nf4" is loaded 4-bit by
    bitsandbytes (QLoRA), computing in the role's compute dtype.
    """
    with transformers_import():
        import transformers.modeling_utils  # noqa: F401 - every model's base, with the loss table
        from transformers import (
            AutoConfig,
            AutoModelForCausalLM,
            AutoModelForImageTextToText,
            AutoModelForTokenClassification,
        )

    path = resolve_model_path(path)
    config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code)
    for key, value in (override_config or {}).items():
        setattr(config, key, value)
    if value_head:
        config.num_labels = 1
        # transformers' token classifiers put dropout before the score head, 0.1 unless the config sets
        # `classifier_dropout`; a value function must not (its training forward would be noisy and
        # differ from compute_values), so the key is set even where the config does not carry it.
        config.classifier_dropout = 0.0
        if hasattr(config, "hidden_dropout"):
            config.hidden_dropout = 0.0
    vision = getattr(config, "vision_config", None) is not None
    if value_head and vision:
        raise NotImplementedError("a critic (value head) on a vision-language model is not built; use a "
                                  "critic-free estimator (algorithm.adv_estimator=grpo/rloo/reinforce_plus_plus)")
    auto_cls = (AutoModelForTokenClassification if value_head
                else AutoModelForImageTextToText if vision else AutoModelForCausalLM)
    # Weights missing from the checkpoint (the critic's score head) are drawn at random: seed them so
    # every rank, and every run, starts from the same values.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = auto_cls.from_pretrained(
            path,
            config=config,
            dtype=torch_dtype(storage_dtype(role_plan, train)),
            attn_implementation=role_plan.attn_implementation,
            trust_remote_code=trust_remote_code,
            **_quantization(role_plan),
        )
    if role_plan.base_quantization is not None:
        _keep_4bit_layout(model)
    if value_head:
        # A fresh score head would come up in the checkpoint's storage dtype; keep it in param dtype.
        model.to(torch_dtype(role_plan.param_dtype))
    if train and role_plan.gradient_checkpointing:
        _checkpoint_activations(model)
    # from_pretrained returns eval mode; a trained model starts in train mode, a frozen one without grads.
    model.train(train)
    if not train:
        model.requires_grad_(False)
    return model


def _checkpoint_activations(model) -> None:
    """Non-reentrant activation checkpointing, by the name this transformers gives it (later 5.x releases
    renamed `gradient_checkpointing_enable`, warning at every call of the old name)."""
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None:
        enable(activation_checkpointing_kwargs={"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def vision_tower(model: torch.nn.Module) -> torch.nn.Module | None:
    """A VL model's vision encoder (transformers names it `visual` in Qwen-VL), or None."""
    inner = getattr(model, "model", model)
    return getattr(inner, "visual", None) or getattr(model, "visual", None)


def freeze_vision_tower(model: torch.nn.Module) -> None:
    """`actor.freeze_vision_tower`: the whole encoder (its patch merger included) keeps its weights and
    only the decoder trains; the encoder's parameters get neither gradients nor optimizer state."""
    tower = vision_tower(model)
    if tower is None:
        raise ValueError(f"actor_rollout_ref.actor.freeze_vision_tower=True, but {type(model).__name__} has no "
                         "vision tower; set it False for a text-only model")
    tower.requires_grad_(False)


def storage_dtype(role_plan: RolePlan, train: bool) -> str:
    """The dtype the loaded weights are stored in: `frozen_dtype` for weights that never train (a
    model loaded without training, or a LoRA base), else `param_dtype`."""
    frozen = not train or role_plan.lora_rank > 0
    return role_plan.frozen_dtype if frozen and role_plan.frozen_dtype else role_plan.param_dtype


def _quantization(role_plan: RolePlan) -> dict:
    """from_pretrained's keywords for the plan's `base_quantization` (none, or bitsandbytes' nf4)."""
    if role_plan.base_quantization is None:
        return {}
    if role_plan.base_quantization != "nf4":
        raise NotImplementedError(f"base quantization {role_plan.base_quantization!r}: only nf4 (QLoRA) is built")
    if role_plan.lora_rank <= 0:
        raise ValueError("a 4-bit base (actor_rollout_ref.model.load_in_4bit) trains only through LoRA adapters; "
                         "set actor_rollout_ref.model.lora_rank > 0")
    try:
        import bitsandbytes  # noqa: F401
    except ImportError as err:
        raise ImportError("actor_rollout_ref.model.load_in_4bit needs bitsandbytes: pip install 'verl[bnb]'") from err
    from transformers import BitsAndBytesConfig

    return {"quantization_config": BitsAndBytesConfig(
        load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=torch_dtype(role_plan.compute_dtype))}


def _keep_4bit_layout(model: torch.nn.Module) -> None:
    """bitsandbytes repacks a 4-bit weight for its CPU inference kernel at the first no-grad forward in
    eval mode (scoring, generation); a training forward over the repacked weight then fails (bitsandbytes
    0.50). A LoRA base alternates both kinds of pass, so it keeps the layout it was quantized in."""
    for module in model.modules():
        if hasattr(module, "support_avx512bf16_for_cpu"):
            module.support_avx512bf16_for_cpu = False
