"""examples/data_preprocess/gsm8k.py on the real GSM8K files: upstream's schema, counts and labels."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
from shared_data import real_data

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "examples" / "data_preprocess" / "gsm8k.py"
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'


def load_script():
    spec = importlib.util.spec_from_file_location("gsm8k_preprocess", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def script():
    return load_script()


@pytest.fixture(scope="module")
def output(tmp_path_factory, script):
    """The real GSM8K files through the script (the tests using it are about the real data)."""
    out = tmp_path_factory.mktemp("gsm8k")
    script.main(["--local_dataset_path", str(real_data("gsm8k")), "--local_save_dir", str(out)])
    return out


@pytest.fixture
def small_gsm8k(tmp_path):
    """A folder shaped like the GSM8K release (train.jsonl, test.jsonl), three and two rows."""
    folder = tmp_path / "gsm8k_small"
    folder.mkdir()
    for split, count in (("train", 3), ("test", 2)):
        rows = [{"question": f"What is {i} + {i}?", "answer": f"{i} + {i} = {2 * i}\n#### {2 * i}"} for i in range(count)]
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(folder)


def test_row_counts(output):
    assert pq.read_metadata(output / "train.parquet").num_rows == 7473
    assert pq.read_metadata(output / "test.parquet").num_rows == 1319


def test_schema_matches_upstream(output):
    schema = pq.read_schema(output / "train.parquet")
    assert schema.names == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    assert [f.name for f in schema.field("reward_model").type] == ["style", "ground_truth"]
    assert [f.name for f in schema.field("extra_info").type] == ["split", "index", "answer", "question"]


def test_first_training_row(output):
    row = pq.read_table(output / "train.parquet").slice(0, 1).to_pylist()[0]
    question = (
        "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
        "How many clips did Natalia sell altogether in April and May?"
    )
    assert row["data_source"] == "openai/gsm8k"
    assert row["ability"] == "math"
    assert row["prompt"] == [{"role": "user", "content": question + " " + INSTRUCTION}]
    assert row["reward_model"] == {"style": "rule", "ground_truth": "72"}
    assert row["extra_info"]["split"] == "train" and row["extra_info"]["index"] == 0
    assert row["extra_info"]["question"] == question
    assert row["extra_info"]["answer"].endswith("#### 72")


def test_labels_drop_commas_and_keep_signs(output):
    rows = pq.read_table(output / "train.parquet").to_pylist()
    raw = [json.loads(line) for line in open(os.path.join(real_data("gsm8k"), "train.jsonl"))]
    labels = [r["reward_model"]["ground_truth"] for r in rows]
    assert all("," not in label for label in labels)
    with_commas = [i for i, r in enumerate(raw) if "," in r["answer"].split("#### ")[-1]]
    assert with_commas, "the real data has answers like '#### 1,000'"
    for i in with_commas:
        assert labels[i] == raw[i]["answer"].split("#### ")[-1].replace(",", "")
    assert sum(label.startswith("-") for label in labels) == 3
    assert [r["extra_info"]["index"] for r in rows] == list(range(7473))


def test_test_split_is_marked(output):
    extra = pq.read_table(output / "test.parquet", columns=["extra_info"]).column("extra_info").to_pylist()
    assert {e["split"] for e in extra} == {"test"}


def test_hub_is_the_default_source(tmp_path, script, monkeypatch):
    """Without --local_dataset_path the script asks datasets for openai/gsm8k, config main."""
    import datasets

    calls = []
    one_row = {"question": ["q?"], "answer": ["a\n#### 1,5"]}
    fake = {split: datasets.Dataset.from_dict(one_row) for split in ("train", "test")}

    def fake_load_dataset(*args, **kwargs):
        calls.append(args)
        return fake

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    script.main(["--local_save_dir", str(tmp_path)])
    assert calls == [("openai/gsm8k", "main")]
    assert pq.read_table(tmp_path / "test.parquet").to_pylist()[0]["reward_model"]["ground_truth"] == "15"


def test_hub_style_folder_uses_the_main_config(tmp_path, script):
    """A downloaded copy of the hub repo has main/ and socratic/ folders of parquet shards."""
    for config, text in (("main", "#### 2"), ("socratic", "#### 999")):
        (tmp_path / config).mkdir()
        for split in ("train", "test"):
            frame = pd.DataFrame({"question": ["q"], "answer": [text]})
            frame.to_parquet(tmp_path / config / f"{split}-00000-of-00001.parquet")
    splits = script.load_local(str(tmp_path))
    assert splits["train"]["answer"].tolist() == ["#### 2"]


def test_missing_split_file_is_explained(tmp_path, script):
    (tmp_path / "train.jsonl").write_text('{"question": "q", "answer": "#### 1"}\n')
    with pytest.raises(FileNotFoundError, match="no test file"):
        script.load_local(str(tmp_path))


def test_own_output_beside_the_source_is_explained(tmp_path, script):
    """Writing the parquet files into the source folder, then preprocessing that folder again, names the
    file and the missing columns (pyarrow alone said "No match for FieldRef.Name(question)")."""
    for split in ("train", "test"):
        (tmp_path / f"{split}.jsonl").write_text('{"question": "q", "answer": "#### 1"}\n')
    script.main(["--local_dataset_path", str(tmp_path), "--local_save_dir", str(tmp_path)])
    with pytest.raises(ValueError, match=r"train.parquet lacks the column\(s\) \['answer', 'question'\].*folder of their own"):
        script.load_local(str(tmp_path))


def test_answer_without_marker_is_explained(script):
    with pytest.raises(ValueError, match="####"):
        script.final_answer("no final line")


def test_command_line_with_the_old_flag(tmp_path, small_gsm8k):
    """Run as users do, with upstream's deprecated --local_dir spelling and a plain-directory --hdfs_dir."""
    mirror = tmp_path / "mirror"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--local_dataset_path", small_gsm8k, "--local_dir", str(tmp_path / "out"),
         "--hdfs_dir", str(mirror)],
        capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "deprecated" in result.stdout and "wrote 3 train rows" in result.stdout
    assert (tmp_path / "out" / "train.parquet").exists() and (mirror / "test.parquet").exists()


def test_hdfs_upload_fails_before_any_work(tmp_path, script, small_gsm8k):
    with pytest.raises(SystemExit, match="hdfs dfs -put"):
        script.main(["--local_dataset_path", small_gsm8k, "--local_save_dir", str(tmp_path / "o"), "--hdfs_dir", "hdfs://x"])
    assert not (tmp_path / "o").exists()
