"""hf_tokenizer / hf_processor (upstream's names, re-exported from verl.utils) on the real Qwen tokenizer."""
import json
import shutil
from pathlib import Path

import pytest

from shared_data import DATA_ENV, data_root, real_data_path
from verl.utils import hf_processor, hf_tokenizer
from verl.workers.model_building.loading import load_tokenizer

QWEN = real_data_path("qwen-tokenizer")
pytestmark = pytest.mark.skipif(QWEN is None, reason=f"the real Qwen tokenizer is not in {data_root()} ({DATA_ENV})")


def copy_tokenizer(dest: Path, **config_changes) -> str:
    shutil.copytree(QWEN, dest)
    config = json.loads((dest / "tokenizer_config.json").read_text())
    config.update(config_changes)
    (dest / "tokenizer_config.json").write_text(json.dumps(config))
    return str(dest)


def test_keeps_a_pad_token_the_tokenizer_has():
    tok = hf_tokenizer(str(QWEN))
    assert (tok.pad_token, tok.eos_token) == ("<|endoftext|>", "<|im_end|>")


def test_pad_token_falls_back_to_eos_with_a_warning(tmp_path):
    path = copy_tokenizer(tmp_path / "nopad", pad_token=None)
    with pytest.warns(UserWarning, match="no pad_token_id"):
        tok = hf_tokenizer(path)
    assert (tok.pad_token, tok.pad_token_id) == (tok.eos_token, tok.eos_token_id) == ("<|im_end|>", 151645)
    assert hf_tokenizer(path, correct_pad_token=False).pad_token_id is None
    with pytest.warns(UserWarning, match="no pad_token_id"):
        assert load_tokenizer(path).pad_token_id == 151645      # the workers' loader delegates here


def test_gemma2_it_stops_at_end_of_turn(tmp_path):
    path = copy_tokenizer(tmp_path / "gemma-2-2b-it")
    with pytest.warns(UserWarning, match="end_of_turn"):
        assert hf_tokenizer(path).eos_token == "<end_of_turn>"
    assert hf_tokenizer(path, correct_gemma2=False).eos_token == "<|im_end|>"


def test_hf_processor_is_none_for_text_only_models(tmp_path):
    assert hf_processor(str(QWEN)) is None                       # transformers hands back the tokenizer
    with pytest.warns(UserWarning, match="no processor loaded"):
        assert hf_processor(str(tmp_path)) is None               # nothing to load at all
