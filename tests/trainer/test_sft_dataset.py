"""MultiTurnSFTDataset: which tokens a conversation trains on, truncation, and bad rows named."""
import pandas as pd
import pytest

from verl.utils.dataset.multiturn_sft_dataset import MultiTurnSFTDataset, collate_sft

CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "2 + 2?"},
    {"role": "assistant", "content": "4"},
    {"role": "user", "content": "and 3 + 3?"},
    {"role": "assistant", "content": "6"},
]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    from verl.utils.tiny_model import build_tokenizer

    return build_tokenizer(str(tmp_path_factory.mktemp("tok")))


def _dataset(tokenizer, tmp_path, rows, **config):
    path = tmp_path / "sft.parquet"
    pd.DataFrame({"messages": rows}).to_parquet(path)
    return MultiTurnSFTDataset(str(path), tokenizer, {"max_length": 1024, **config})


def test_only_assistant_turns_are_trained_and_the_whole_conversation_is_kept(tokenizer, tmp_path):
    item = _dataset(tokenizer, tmp_path, [CONVERSATION])[0]
    ids, mask = item["input_ids"], item["loss_mask"].bool()
    whole = tokenizer.apply_chat_template(CONVERSATION, tokenize=False)
    assert tokenizer.decode(ids) == whole
    # each assistant turn trains on its content and end marker, not on the "<|im_start|>assistant\n" it opens with
    trained = tokenizer.decode(ids[mask])
    assert trained == "4<|im_end|>\n6<|im_end|>\n"


def test_single_turn_rows_and_batches_pad_right(tokenizer, tmp_path):
    rows = [[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello there"}], CONVERSATION]
    data = _dataset(tokenizer, tmp_path, rows)
    batch = collate_sft([data[0], data[1]], pad_token_id=tokenizer.pad_token_id)
    short = len(data[0]["input_ids"])
    assert batch["attention_mask"][0].tolist() == [1] * short + [0] * (batch["input_ids"].shape[1] - short)
    assert (batch["loss_mask"] <= batch["attention_mask"]).all()
    assert tokenizer.decode(data[0]["input_ids"][data[0]["loss_mask"].bool()]) == "hello there<|im_end|>\n"


def test_truncation_and_errors_name_the_key(tokenizer, tmp_path):
    full = len(_dataset(tokenizer, tmp_path, [CONVERSATION])[0]["input_ids"])
    with pytest.raises(ValueError, match="over data.max_length=8"):
        _dataset(tokenizer, tmp_path, [CONVERSATION], max_length=8)[0]
    left = _dataset(tokenizer, tmp_path, [CONVERSATION], max_length=8, truncation="left")[0]
    assert len(left["input_ids"]) == 8 < full
    assert tokenizer.decode(left["input_ids"]).endswith("6<|im_end|>\n")
    with pytest.raises(ValueError, match="has no assistant message"):
        _dataset(tokenizer, tmp_path, [[{"role": "user", "content": "hi"}]])
    with pytest.raises(KeyError, match="data.messages_key"):
        _dataset(tokenizer, tmp_path, [CONVERSATION], messages_key="conversations")


def test_micro_batches_by_rows_or_by_padded_token_budget():
    import torch

    from verl.trainer.sft_trainer import micro_batches

    rows = [{"input_ids": torch.zeros(n)} for n in (3, 5, 2, 8, 1)]
    assert [len(b) for b in micro_batches(rows, 2, None)] == [2, 2, 1]
    # padded to the longest row of the micro-batch: 3,5 -> 10 tokens, +2 -> 15; 2,8 -> 16; 8,1 -> 16
    assert [[len(r["input_ids"]) for r in b] for b in micro_batches(rows, None, 12)] == [[3, 5], [2], [8], [1]]
    assert [[len(r["input_ids"]) for r in b] for b in micro_batches(rows, None, 16)] == [[3, 5, 2], [8, 1]]
    assert [len(b) for b in micro_batches(rows, None, 4)] == [1, 1, 1, 1, 1]   # a row over the budget goes alone


def test_overlong_conversations_are_listed_up_front_with_their_exact_lengths(tokenizer, tmp_path):
    short = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "ok"}]
    data = _dataset(tokenizer, tmp_path, [short, CONVERSATION, short, CONVERSATION], max_length=24)
    exact = [len(data[i]["input_ids"]) for i in (0, 2)] + [len(data.tokens(i)[0]) for i in (1, 3)]
    assert exact[0] <= 24 < exact[2]                          # the short rows fit, the long ones do not
    assert data.overlong_rows() == [(1, exact[2]), (3, exact[3])]
    assert _dataset(tokenizer, tmp_path, [CONVERSATION], max_length=24, truncation="left").overlong_rows() == []
