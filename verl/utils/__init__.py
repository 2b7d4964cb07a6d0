"""Utilities shared across verl: data sets, reward rules and tensor helpers (see the submodules).

`hf_tokenizer` / `hf_processor` are re-exported as upstream does; they load transformers only when
called, so importing this package stays cheap.
"""
from verl.utils.tokenizer import hf_processor, hf_tokenizer

__all__ = ["hf_processor", "hf_tokenizer"]
