"""Tokenizer and processor loading under upstream's names (`hf_tokenizer`, `hf_processor`).

Both import transformers only when called, so `verl.utils` stays cheap to import.
"""
from __future__ import annotations

import warnings

__all__ = ["PROCESSOR_FILES", "copy_processor_files", "hf_processor", "hf_tokenizer", "normalize_token_ids"]

# A multimodal processor's own files beside the tokenizer's (image/video settings, its class, the chat
# template transformers 5 keeps apart from tokenizer_config.json).
PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json", "video_preprocessor_config.json",
                   "chat_template.jinja", "chat_template.json")

# gemma-2-2b-it ships two end-of-turn candidates; generation must stop at <end_of_turn> (id 107),
# otherwise responses run on past the turn and RL rewards the wrong text.
_GEMMA2_IT = "gemma-2-2b-it"


def _fill_pad_token(tokenizer) -> None:
    """Many causal-LM tokenizers ship without a pad token; batching needs one, and EOS is harmless
    there because the attention mask hides padding."""
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token_id = tokenizer.eos_token_id
        warnings.warn(f"the tokenizer has no pad_token_id; using eos_token_id={tokenizer.eos_token_id}",
                      stacklevel=3)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
        warnings.warn(f"the tokenizer has no pad_token; using eos_token={tokenizer.eos_token!r}", stacklevel=3)


def hf_tokenizer(name_or_path, correct_pad_token: bool = True, correct_gemma2: bool = True, **kwargs):
    """`AutoTokenizer.from_pretrained(name_or_path, **kwargs)` with a pad token (EOS when it has none,
    unless `correct_pad_token=False`) and gemma-2-2b-it's end-of-turn EOS (unless `correct_gemma2=False`)."""
    from verl.utils.startup.transformers_import import transformers_import

    if correct_gemma2 and isinstance(name_or_path, str) and _GEMMA2_IT in name_or_path:
        warnings.warn(f"{_GEMMA2_IT}: using <end_of_turn> (id 107) as the EOS token", stacklevel=2)
        kwargs.update(eos_token="<end_of_turn>", eos_token_id=107)
    with transformers_import():
        from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(name_or_path, **kwargs)
    if correct_pad_token:
        _fill_pad_token(tokenizer)
    return tokenizer


def hf_processor(name_or_path, **kwargs):
    """The model's multimodal processor, or None for a text-only model (where transformers hands back
    a plain tokenizer, or finds no processor at all)."""
    from transformers import AutoProcessor, PreTrainedTokenizerBase

    try:
        try:
            processor = AutoProcessor.from_pretrained(name_or_path, **kwargs)
        except ImportError as err:
            if "torchvision" not in str(err).lower():
                raise
            processor = _image_processor_only(name_or_path, **kwargs)
    except Exception as err:   # noqa: BLE001 - any loading failure means "no processor" here
        warnings.warn(f"no processor loaded from {name_or_path!r} ({type(err).__name__}: {err}); "
                      "treating the model as text-only", stacklevel=2)
        return None
    if isinstance(processor, PreTrainedTokenizerBase) or "Processor" not in type(processor).__name__:
        return None
    return processor


def _image_processor_only(name_or_path, **kwargs):
    """The folder's processor for images, built without its video processor.

    transformers constructs Qwen-VL processors only with torchvision installed, because their video
    processor needs it, even when no video is ever passed. Without torchvision the tokenizer, the image
    processor and the chat template are loaded one by one and joined in the processor class, whose type
    check is relaxed for the missing video processor alone (videos then fail inside transformers)."""
    import json
    import os

    import transformers
    from transformers import AutoImageProcessor, AutoTokenizer, PreTrainedTokenizerBase

    from verl.utils.fs import resolve_model_path

    folder = resolve_model_path(name_or_path)
    name = None
    for file in ("processor_config.json", "preprocessor_config.json"):
        path = os.path.join(folder, file)
        if os.path.isfile(path):
            with open(path) as f:
                name = name or json.load(f).get("processor_class")
    base = getattr(transformers, name, None) if name else None
    # transformers 5 lists a processor's parts with get_attributes(), 4.x in the `attributes` class field
    attributes = (base.get_attributes() if hasattr(base, "get_attributes") else list(getattr(base, "attributes", ()))
                  ) if base is not None else []
    if "video_processor" not in attributes:
        raise ImportError(f"{name_or_path}: processor {name!r} needs torchvision")

    class ImageOnly(base):
        def check_argument_for_proper_class(self, argument_name, argument):
            if argument_name == "video_processor" and argument is None:
                return None
            # transformers 4.x also wants the model's own tokenizer class; any fast tokenizer works here
            # (transformers 5 accepts one too), e.g. a folder's re-saved PreTrainedTokenizerFast
            if argument_name == "tokenizer" and isinstance(argument, PreTrainedTokenizerBase):
                return None
            return super().check_argument_for_proper_class(argument_name, argument)

    ImageOnly.__name__ = ImageOnly.__qualname__ = base.__name__
    template = None
    template_file = os.path.join(folder, "chat_template.jinja")
    if os.path.isfile(template_file):
        with open(template_file) as f:
            template = f.read()
    parts = {"tokenizer": AutoTokenizer.from_pretrained(folder, **kwargs),
             "image_processor": AutoImageProcessor.from_pretrained(folder, **kwargs), "video_processor": None}
    args = {attr: parts[attr] for attr in attributes}
    return ImageOnly(**args, chat_template=template or getattr(args["tokenizer"], "chat_template", None))


def copy_processor_files(source: str, folder: str) -> list[str]:
    """Copy the model folder `source`'s processor files (PROCESSOR_FILES, where present) into `folder`, so
    a checkpoint's huggingface/ folder, and the model merged from it, load with the model's processor.
    Copied rather than re-saved: saving a Qwen-VL processor needs torchvision (see hf_processor)."""
    import os
    import shutil

    from verl.utils.fs import resolve_model_path

    source = resolve_model_path(source)
    copied = []
    for name in PROCESSOR_FILES:
        path = os.path.join(source, name)
        if os.path.isfile(path):
            shutil.copyfile(path, os.path.join(folder, name))
            copied.append(name)
    return copied


from verl.utils.tokenizer.tokenizer import normalize_token_ids  # noqa: E402 - upstream's home for it is the submodule
