"""Tokenizer and processor loading under upstream's names (`hf_tokenizer`, `hf_processor`).

Both import transformers only when called, so `verl.utils` stays cheap to import.
"""
from __future__ import annotations

import warnings

__all__ = ["hf_processor", "hf_tokenizer"]

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
    from verl.utils.transformers_import import transformers_import

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
        processor = AutoProcessor.from_pretrained(name_or_path, **kwargs)
    except Exception as err:   # noqa: BLE001 - any loading failure means "no processor" here
        warnings.warn(f"no processor loaded from {name_or_path!r} ({type(err).__name__}: {err}); "
                      "treating the model as text-only", stacklevel=2)
        return None
    if isinstance(processor, PreTrainedTokenizerBase) or "Processor" not in type(processor).__name__:
        return None
    return processor
