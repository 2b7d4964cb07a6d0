"""Upstream's `verl.utils.tokenizer.tokenizer`: the loaders of the package (`hf_tokenizer`, `hf_processor`),
`set_pad_token_id` and `normalize_token_ids`. The multimodal processor-input builders of upstream's async agent
loop are not supported (they raise NotImplementedError)."""
from __future__ import annotations

from verl._unsupported import stand_in
from verl.utils.tokenizer import _fill_pad_token, hf_processor, hf_tokenizer

__all__ = ["hf_processor", "hf_tokenizer", "normalize_token_ids", "set_pad_token_id"]

__getattr__ = stand_in(__name__, "the multimodal processor-input builders of upstream's async agent loop")


def set_pad_token_id(tokenizer) -> None:
    """Give a tokenizer without a pad token its EOS token as pad (with a warning)."""
    _fill_pad_token(tokenizer)


def normalize_token_ids(tokenized_output) -> list[int]:
    """A flat list of ints from what `apply_chat_template(tokenize=True)` returns in any transformers version:
    a list, a (1, n) nested list, a tensor or array, or a BatchEncoding / mapping with `input_ids`."""
    ids = tokenized_output
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"] if isinstance(ids, dict) and "input_ids" in ids else getattr(ids, "input_ids", ids)
    if hasattr(ids, "tolist"):
        ids = ids.tolist()
    if isinstance(ids, tuple):
        ids = list(ids)
    if isinstance(ids, list) and len(ids) == 1 and isinstance(ids[0], (list, tuple)):
        ids = list(ids[0])
    if not isinstance(ids, list):
        raise TypeError(f"expected token ids (a list, tensor or input_ids mapping), got {type(ids).__name__}")
    out = []
    for token in ids:
        try:
            out.append(int(token.item() if hasattr(token, "item") else token))
        except (TypeError, ValueError) as err:
            raise TypeError(f"token id {token!r} ({type(token).__name__}) is not an integer") from err
    return out
