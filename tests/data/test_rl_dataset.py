"""RLHFDataset: chat template, left padding, truncation modes, the over-long filter, errors, collate_fn."""

import json
import pickle
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf
from transformers import AutoTokenizer

from shared_data import real_data, tiny_tokenizer_dir
from verl.protocol import DataProto
from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn, create_rl_dataset, create_rl_sampler

MAX_LEN = 32


@pytest.fixture(scope="module", params=["tiny", "qwen"])
def tokenizer(request, tmp_path_factory):
    """Each test runs with a tokenizer built here and with the real Qwen tokenizer (skipped where absent)."""
    if request.param == "qwen":
        return AutoTokenizer.from_pretrained(real_data("qwen-tokenizer"))
    corpus = [SHORT, LONG, "x " * 20, "Add 3 and 5.", "Question Another?", "user\nassistant\nsystem\n"]
    return AutoTokenizer.from_pretrained(tiny_tokenizer_dir(tmp_path_factory.mktemp("tiny_tokenizer"), corpus * 4))


@pytest.fixture(scope="module")
def qwen_tokenizer():
    """The real Qwen tokenizer, for the tests whose point is the real GSM8K token counts."""
    return AutoTokenizer.from_pretrained(real_data("qwen-tokenizer"))


def row(question, index, answer="1"):
    return {
        "data_source": "openai/gsm8k",
        "prompt": [{"role": "user", "content": question}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"split": "train", "index": index},
    }


SHORT = "What is 2+2?"
LONG = " ".join(f"word{i}" for i in range(40))  # far over MAX_LEN tokens once chat-formatted


@pytest.fixture
def parquet(tmp_path):
    path = tmp_path / "train.parquet"
    pd.DataFrame([row(SHORT, 0, "4"), row(LONG, 1), row("Add 3 and 5.", 2, "8")]).to_parquet(path)
    return str(path)


def config(**overrides):
    base = {
        "prompt_key": "prompt",
        "max_prompt_length": MAX_LEN,
        "truncation": "error",
        "filter_overlong_prompts": False,
        "return_raw_chat": False,
        "return_full_prompt": False,
        "apply_chat_template_kwargs": {},
        "shuffle": True,
        "seed": None,
        "train_max_samples": -1,
        "val_max_samples": -1,
    }
    return OmegaConf.create({**base, **overrides})


def chat_ids(tokenizer, question):
    text = tokenizer.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True,
                                         tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_short_prompt_is_left_padded(tokenizer, parquet):
    sample = RLHFDataset(parquet, tokenizer, config())[0]
    ids = chat_ids(tokenizer, SHORT)
    pad = MAX_LEN - len(ids)
    assert sample["input_ids"].shape == sample["attention_mask"].shape == sample["position_ids"].shape == (MAX_LEN,)
    assert sample["input_ids"].tolist() == [tokenizer.pad_token_id] * pad + ids
    assert sample["attention_mask"].tolist() == [0] * pad + [1] * len(ids)
    assert sample["position_ids"].tolist() == [0] * pad + list(range(len(ids)))
    assert sample["raw_prompt_ids"] == ids
    assert sample["index"] == 0 and sample["tools_kwargs"] == {} and sample["interaction_kwargs"] == {}
    assert sample["reward_model"] == {"style": "rule", "ground_truth": "4"}
    assert sample["data_source"] == "openai/gsm8k" and sample["extra_info"]["split"] == "train"
    assert "prompt" not in sample and "raw_prompt" not in sample and "full_prompts" not in sample


def test_raw_chat_and_full_prompt_on_request(tokenizer, parquet):
    sample = RLHFDataset(parquet, tokenizer, config(return_raw_chat=True, return_full_prompt=True))[0]
    assert sample["raw_prompt"] == [{"role": "user", "content": SHORT}]
    assert sample["full_prompts"].startswith("<|im_start|>user\nWhat is 2+2?")
    assert sample["full_prompts"].endswith("<|im_start|>assistant\n")


def test_chat_template_kwargs_are_passed(tokenizer, parquet):
    """data.apply_chat_template_kwargs reach the template (Qwen3's enable_thinking is a real use)."""
    tokenizer_template = tokenizer.chat_template
    custom = "{% for m in messages %}[{{ m.content }}|{{ marker }}]{% endfor %}"
    tokenizer.chat_template = custom
    try:
        sample = RLHFDataset(parquet, tokenizer, config(return_full_prompt=True,
                                                        apply_chat_template_kwargs={"marker": "X"}))[0]
    finally:
        tokenizer.chat_template = tokenizer_template
    assert sample["full_prompts"] == f"[{SHORT}|X]"


@pytest.mark.parametrize("mode", ["left", "right", "middle"])
def test_truncation_modes_keep_the_documented_tokens(tokenizer, parquet, mode):
    sample = RLHFDataset(parquet, tokenizer, config(truncation=mode))[1]
    full = chat_ids(tokenizer, LONG)
    assert len(full) > MAX_LEN
    expected = {
        "left": full[-MAX_LEN:],
        "right": full[:MAX_LEN],
        "middle": full[: MAX_LEN // 2] + full[-(MAX_LEN - MAX_LEN // 2):],
    }[mode]
    assert sample["input_ids"].tolist() == expected
    assert sample["raw_prompt_ids"] == expected
    assert sample["attention_mask"].tolist() == [1] * MAX_LEN
    assert sample["position_ids"].tolist() == list(range(MAX_LEN))


def test_overlong_prompt_with_truncation_error_says_what_to_change(tokenizer, parquet):
    dataset = RLHFDataset(parquet, tokenizer, config())
    with pytest.raises(ValueError) as err:
        dataset[1]
    message = str(err.value)
    assert "row 1 of" in message and "train.parquet" in message
    for hint in ("filter_overlong_prompts=True", "data.truncation", "max_prompt_length"):
        assert hint in message


def test_prompt_counts_are_kept_for_the_next_run_over_the_same_inputs(tokenizer, parquet, tmp_path, monkeypatch):
    """A second dataset over the same file, rows, tokenizer and template reads the counts the first one computed
    (nothing is rendered); other template arguments or changed file contents are counted afresh; a damaged
    cache file is recomputed."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    expected = [len(chat_ids(tokenizer, q)) for q in (SHORT, LONG, "Add 3 and 5.")]
    assert RLHFDataset(parquet, tokenizer, config())._prompt_lengths().tolist() == expected
    again = RLHFDataset(parquet, tokenizer, config())
    monkeypatch.setattr(again, "_render", lambda *a, **k: pytest.fail("rendered although the counts were kept"))
    assert again._prompt_lengths().tolist() == expected

    def renders(dataset) -> int:
        calls, real = [], dataset._render
        monkeypatch.setattr(dataset, "_render", lambda *a, **k: calls.append(1) or real(*a, **k))
        dataset._prompt_lengths()
        return len(calls)

    assert renders(RLHFDataset(parquet, tokenizer, config(apply_chat_template_kwargs={"enable_thinking": False}))) == 3
    pd.DataFrame([row(SHORT, 0, "4")]).to_parquet(parquet)
    assert RLHFDataset(parquet, tokenizer, config())._prompt_lengths().tolist() == expected[:1]
    for kept in (tmp_path / "cache" / "verl" / "prompt_lengths").glob("*.npy"):
        kept.write_bytes(b"damaged")
    assert renders(RLHFDataset(parquet, tokenizer, config())) == 1


def test_filter_drops_overlong_prompts(tokenizer, parquet, capsys):
    dataset = RLHFDataset(parquet, tokenizer, config(filter_overlong_prompts=True))
    assert len(dataset) == 2
    assert [dataset[i]["index"] for i in range(2)] == [0, 2]
    # the load line says what removed the rows: the sample limit and the length filter each with their count
    RLHFDataset(parquet, tokenizer, config(filter_overlong_prompts=True, shuffle=False), max_samples=2)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("(1 prompts over 32 tokens dropped)") and lines[0].startswith("RLHFDataset: 2 of 3 rows")
    assert lines[1].endswith("(the first 2 kept (data.train_max_samples / val_max_samples); 1 prompts over 32 tokens "
                             "dropped)") and lines[1].startswith("RLHFDataset: 1 of 3 rows")


def test_error_after_filtering_names_the_original_row(tokenizer, tmp_path):
    path = tmp_path / "t.parquet"
    pd.DataFrame([row(SHORT, 0), row(LONG, 1), row("x " * 20, 2)]).to_parquet(path)
    dataset = RLHFDataset(str(path), tokenizer, config(filter_overlong_prompts=True, max_prompt_length=40))
    assert len(dataset) == 2  # the 40-word prompt is dropped
    dataset.max_prompt_length = 10  # now even row 2 is too long
    with pytest.raises(ValueError, match="row 2 of"):
        dataset[1]


def test_several_files_and_formats(tokenizer, tmp_path, parquet):
    jsonl = tmp_path / "more.jsonl"
    jsonl.write_text("\n".join(json.dumps(row(f"Question {i}?", 10 + i)) for i in range(2)) + "\n")
    as_json = tmp_path / "more.json"
    as_json.write_text(json.dumps([row("Another?", 20), row(LONG, 21)]))
    dataset = RLHFDataset([parquet, str(jsonl), str(as_json)], tokenizer, config())
    assert len(dataset) == 7
    assert [dataset[i]["index"] for i in (0, 3, 4, 5)] == [0, 10, 11, 20]
    with pytest.raises(ValueError, match=r"row 1 of .*more\.json"):
        dataset[6]


def test_missing_prompt_column_names_file_and_column(tokenizer, tmp_path):
    path = tmp_path / "bad.parquet"
    pd.DataFrame([{"question": "q", "data_source": "x"}]).to_parquet(path)
    with pytest.raises(KeyError) as err:
        RLHFDataset(str(path), tokenizer, config())
    assert "bad.parquet" in str(err.value) and "'prompt'" in str(err.value) and "question" in str(err.value)


def test_prompt_key_is_configurable(tokenizer, tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps({"messages": [{"role": "user", "content": SHORT}], "data_source": "d"}) + "\n")
    sample = RLHFDataset(str(path), tokenizer, config(prompt_key="messages"))[0]
    assert sample["raw_prompt_ids"] == chat_ids(tokenizer, SHORT)
    assert sample["extra_info"] == {} and sample["index"] == 0


def test_plain_string_prompt_is_explained(tokenizer, tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_text(json.dumps({"prompt": "just text", "data_source": "d"}) + "\n")
    with pytest.raises(TypeError, match=r"row 0 of .*s\.jsonl.*list of"):
        RLHFDataset(str(path), tokenizer, config())[0]


def test_unreadable_and_missing_files_are_named(tokenizer, tmp_path):
    broken = tmp_path / "broken.parquet"
    broken.write_bytes(b"this is not parquet")
    with pytest.raises(ValueError, match="broken.parquet"):
        RLHFDataset(str(broken), tokenizer, config())
    with pytest.raises(FileNotFoundError, match="absent.parquet"):
        RLHFDataset(str(tmp_path / "absent.parquet"), tokenizer, config())
    with pytest.raises(ValueError, match="unsupported data file"):
        other = tmp_path / "data.csv"
        other.write_text("a,b\n")
        RLHFDataset(str(other), tokenizer, config())


def test_bad_truncation_value_and_missing_chat_template(tokenizer, parquet):
    with pytest.raises(ValueError, match="data.truncation"):
        RLHFDataset(parquet, tokenizer, config(truncation="both"))
    template = tokenizer.chat_template
    tokenizer.chat_template = None
    try:
        with pytest.raises(ValueError, match="chat template"):
            RLHFDataset(parquet, tokenizer, config())
    finally:
        tokenizer.chat_template = template


def test_dataset_pickles_for_dataloader_workers(tokenizer, parquet):
    dataset = RLHFDataset(parquet, tokenizer, config(truncation="left"))
    copy = pickle.loads(pickle.dumps(dataset))
    assert len(copy) == 3 and torch.equal(copy[1]["input_ids"], dataset[1]["input_ids"])


def test_collate_fn_makes_a_dataproto(tokenizer, parquet):
    dataset = RLHFDataset(parquet, tokenizer, config(truncation="left", return_raw_chat=True))
    batch = collate_fn([dataset[i] for i in range(3)])
    assert batch["input_ids"].shape == (3, MAX_LEN) and batch["input_ids"].dtype == torch.int64
    for key in ("raw_prompt_ids", "raw_prompt", "reward_model", "data_source", "index"):
        assert batch[key].dtype == object and batch[key].shape == (3,)
    # lists of different lengths stay one element each
    assert [len(ids) for ids in batch["raw_prompt_ids"]] == [len(chat_ids(tokenizer, SHORT)), MAX_LEN,
                                                             len(chat_ids(tokenizer, "Add 3 and 5."))]
    data = DataProto.from_single_dict(batch)
    assert len(data) == 3
    assert data.non_tensor_batch["reward_model"][2]["ground_truth"] == "8"
    assert torch.equal(data.batch["attention_mask"], batch["attention_mask"])


def test_max_samples_first_rows_or_seeded_sample(tokenizer, parquet):
    first = RLHFDataset(parquet, tokenizer, config(truncation="left", shuffle=False), max_samples=2)
    assert [first[i]["index"] for i in range(2)] == [0, 1]
    sampled = RLHFDataset(parquet, tokenizer, config(truncation="left", seed=7), max_samples=2)
    expected = np.random.default_rng(7).choice(3, size=2, replace=False).tolist()  # upstream's draw
    assert [sampled[i]["index"] for i in range(2)] == expected


def test_create_rl_dataset_reads_max_samples_from_config(tokenizer, parquet):
    train = create_rl_dataset([parquet], config(truncation="left", train_max_samples=1), tokenizer, None)
    val = create_rl_dataset(parquet, config(truncation="left", train_max_samples=1), tokenizer, None, is_train=False)
    assert (len(train), len(val)) == (1, 3)


def test_custom_dataset_class(tokenizer, parquet, tmp_path):
    module = tmp_path / "my_data.py"
    module.write_text(
        "from verl.utils.dataset.rl_dataset import RLHFDataset\n"
        "class Doubled(RLHFDataset):\n"
        "    def __len__(self):\n"
        "        return 2 * super().__len__()\n"
    )
    cfg = config(truncation="left", custom_cls={"path": str(module), "name": "Doubled"})
    assert len(create_rl_dataset(parquet, cfg, tokenizer, None)) == 6
    cfg.custom_cls.name = "Missing"
    with pytest.raises(AttributeError, match="data.custom_cls.name='Missing'.*Doubled"):
        create_rl_dataset(parquet, cfg, tokenizer, None)


def test_sampler_shuffles_reproducibly_or_keeps_order():
    data = list(range(20))
    first = list(create_rl_sampler(config(shuffle=True, seed=3), data))
    assert first == list(create_rl_sampler(config(shuffle=True, seed=3), data)) and sorted(first) == data
    assert first != data and first != list(create_rl_sampler(config(shuffle=True, seed=4), data))
    assert list(create_rl_sampler(config(shuffle=False), data)) == data


def test_processed_gsm8k_test_split(qwen_tokenizer, tmp_path):
    """The real test split through the preprocessing script and the data set, at upstream's 512-token limit."""
    import importlib.util

    script_path = Path(__file__).resolve().parents[2] / "examples" / "data_preprocess" / "gsm8k.py"
    spec = importlib.util.spec_from_file_location("gsm8k_preprocess_for_dataset", script_path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    script.main(["--local_dataset_path", str(real_data("gsm8k")), "--local_save_dir", str(tmp_path)])

    dataset = RLHFDataset(str(tmp_path / "test.parquet"), qwen_tokenizer,
                          config(max_prompt_length=512, filter_overlong_prompts=True))
    assert len(dataset) == 1319  # no GSM8K prompt comes near 512 tokens
    sample = dataset[0]
    assert sample["reward_model"]["ground_truth"] == "18"
    assert qwen_tokenizer.decode(sample["raw_prompt_ids"]).endswith('after "####".<|im_end|>\n<|im_start|>assistant\n')


def test_filter_counts_equal_each_samples_own_tokenization_on_real_gsm8k(qwen_tokenizer, tmp_path):
    """The over-long filter counts tokens with the fast tokenizer's backend in batches; on the real GSM8K
    test split (Qwen tokenizer) every count equals what `__getitem__` tokenises for that row, so a limit
    keeps exactly the rows whose prompt fits."""
    import importlib.util

    script_path = Path(__file__).resolve().parents[2] / "examples" / "data_preprocess" / "gsm8k.py"
    spec = importlib.util.spec_from_file_location("gsm8k_preprocess_for_filter", script_path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    script.main(["--local_dataset_path", str(real_data("gsm8k")), "--local_save_dir", str(tmp_path)])
    path = str(tmp_path / "test.parquet")

    every = RLHFDataset(path, qwen_tokenizer, config(max_prompt_length=4096))
    counts = every._prompt_lengths()
    messages = pd.read_parquet(path)["prompt"].tolist()
    reference = [len(qwen_tokenizer(qwen_tokenizer.apply_chat_template(list(m), add_generation_prompt=True, tokenize=False),
                               add_special_tokens=False)["input_ids"]) for m in messages]
    assert counts.tolist() == reference

    limit = int(np.median(reference))
    kept = RLHFDataset(path, qwen_tokenizer, config(max_prompt_length=limit, filter_overlong_prompts=True))
    assert len(kept) == sum(n <= limit for n in reference) and 0 < len(kept) < len(reference)
    for i in range(0, len(kept), 97):   # kept rows load without truncation and fit the limit
        assert int(kept[i]["attention_mask"].sum()) <= limit
