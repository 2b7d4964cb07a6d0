"""Images in the data path: geo3k preprocessing, RLHFDataset with the model's processor, the checks that
run before Ray, and the vision tower's size in the planner's ModelSpec."""
import inspect

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from omegaconf import OmegaConf

from vision_data import PROBLEMS, QWEN25_VL_3B_HUB, geo3k_parquet, png_bytes, tiny_vl_model
from verl.utils.dataset.rl_dataset import collate_fn, create_rl_dataset
from verl.workers.model_building.loading import load_processor, load_tokenizer
from tiny_vl_model import tiny_images

MAX_PROMPT = 96


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_vl_model(tmp_path_factory.mktemp("tiny_vl"))


@pytest.fixture(scope="module")
def geo3k(tmp_path_factory):
    return geo3k_parquet(tmp_path_factory.mktemp("geo3k"), rows_per_split=4)


def _dataset(path, model_dir, **data):
    config = OmegaConf.create({"max_prompt_length": MAX_PROMPT, "filter_overlong_prompts": False, **data})
    return create_rl_dataset(str(path), config, load_tokenizer(model_dir), load_processor(model_dir))


def test_geo3k_preprocess_writes_upstreams_schema(geo3k):
    table = pq.read_table(geo3k / "train.parquet")
    assert set(table.column_names) == {"data_source", "prompt", "images", "ability", "reward_model", "extra_info"}
    row = table.slice(1, 1).to_pylist()[0]
    assert row["data_source"] == "hiyouga/geometry3k" and row["ability"] == "math"
    assert row["prompt"][0]["role"] == "user" and row["prompt"][0]["content"].startswith(PROBLEMS[1])
    assert "\\boxed{}" in row["prompt"][0]["content"]
    assert row["reward_model"] == {"style": "rule", "ground_truth": "1"}
    assert row["extra_info"]["index"] == 1 and row["extra_info"]["question"] == PROBLEMS[1]
    assert len(row["images"]) == 1 and row["images"][0]["bytes"][:4] == b"\x89PNG"
    assert pq.read_table(geo3k / "test.parquet").num_rows == 4


def test_dataset_rows_carry_pixels_and_transformers_mrope_positions(geo3k, model_dir):
    from transformers import AutoModelForImageTextToText

    dataset = _dataset(geo3k / "train.parquet", model_dir)
    processor = load_processor(model_dir)
    row = dataset[0]
    mask = row["attention_mask"].bool()
    image_tokens = int((row["input_ids"] == processor.image_token_id).sum())
    grid = row["multi_modal_inputs"]["image_grid_thw"]
    # a 56x56 image: 4x4 patches of 14 pixels, merged 2x2 into 4 image tokens
    assert grid.tolist() == [[1, 4, 4]] and image_tokens == 4
    assert row["multi_modal_inputs"]["pixel_values"].shape == (16, 3 * 2 * 14 * 14)
    assert len(row["multi_modal_data"]["image"]) == 1
    # vLLM's prompt: one image pad per image, widened by vLLM itself
    assert row["raw_prompt_ids"].count(processor.image_token_id) == 1

    # the positions: text first (0.. over real tokens), then the model's own mrope axes
    assert row["position_ids"].shape == (4, MAX_PROMPT)
    assert row["position_ids"][0][mask].tolist() == list(range(int(mask.sum())))
    model = AutoModelForImageTextToText.from_pretrained(model_dir)
    types = (row["input_ids"] == processor.image_token_id).long()
    # transformers 5 marks image tokens with mm_token_type_ids; 4.x finds them by the config's token id
    marks = ({"mm_token_type_ids": types[None]}
             if "mm_token_type_ids" in inspect.signature(model.model.get_rope_index).parameters else {})
    theirs, _ = model.model.get_rope_index(row["input_ids"][None], image_grid_thw=grid,
                                           attention_mask=row["attention_mask"][None], **marks)
    torch.testing.assert_close(row["position_ids"][1:][:, mask], theirs[:, 0][:, mask], rtol=0, atol=0)
    assert not torch.equal(row["position_ids"][1], row["position_ids"][2])   # height and width differ in the image

    batch = collate_fn([dataset[0], dataset[1]])
    assert batch["position_ids"].shape == (2, 4, MAX_PROMPT) and batch["multi_modal_inputs"].shape == (2,)


def _write_rows(path, images_column):
    rows = [{"data_source": "hiyouga/geometry3k", "prompt": [{"role": "user", "content": PROBLEMS[0]}],
             "images": cell, "reward_model": {"style": "rule", "ground_truth": "1"}} for cell in images_column]
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_missing_or_unreadable_image_is_an_error_naming_the_row(tmp_path, model_dir):
    good = [{"bytes": png_bytes(tiny_images(1)[0]), "path": None}]
    missing = _write_rows(tmp_path / "missing.parquet", [good, good, []])
    with pytest.raises(ValueError, match=r"row 2 of .*missing.parquet.*1 <image> placeholder.*holds 0 image"):
        _dataset(missing, model_dir)
    broken = _write_rows(tmp_path / "broken.parquet", [good, [{"bytes": b"not an image", "path": None}]])
    with pytest.raises(ValueError, match=r"row 1 of .*broken.parquet: unreadable image"):
        _dataset(broken, model_dir)


def test_bad_image_rows_stop_main_ppo_before_ray(tmp_path, model_dir):
    """The driver's input checks (task_runner.build_inputs) read every row's images before Ray starts."""
    from verl.trainer.ppo.task_runner import build_inputs
    from verl.trainer.preflight import InputError

    good = [{"bytes": png_bytes(tiny_images(1)[0]), "path": None}]
    train = _write_rows(tmp_path / "train.parquet", [good, [{"bytes": None, "path": str(tmp_path / "gone.png")}]])
    config = OmegaConf.load("verl/trainer/config/ppo_trainer.yaml")
    OmegaConf.update(config, "data.train_files", str(train))
    OmegaConf.update(config, "data.val_files", str(train))
    OmegaConf.update(config, "data.max_prompt_length", MAX_PROMPT)
    OmegaConf.update(config, "actor_rollout_ref.model.path", model_dir)
    with pytest.raises(InputError, match=r"data.train_files: row 1 of .*train.parquet: unreadable image"):
        build_inputs(config)
    import ray

    assert not ray.is_initialized()


def test_over_long_filter_counts_image_tokens(geo3k, model_dir):
    """The over-long filter measures the processor's widened prompt: image tokens count."""
    lengths = _dataset(geo3k / "train.parquet", model_dir)._prompt_lengths()
    text_only = load_tokenizer(model_dir)
    processor = load_processor(model_dir)
    messages = [{"role": "user", "content": PROBLEMS[0].replace("<image>", "") + " x"}]
    assert (lengths > len(text_only.apply_chat_template(messages, add_generation_prompt=True))).all()
    assert processor is not None
    kept = _dataset(geo3k / "train.parquet", model_dir, filter_overlong_prompts=True,
                    max_prompt_length=int(lengths.min()))
    assert len(kept) == int((lengths == lengths.min()).sum())


def test_model_spec_counts_the_vision_tower(model_dir):
    from transformers import AutoModelForImageTextToText

    from verl.compat.planning.model_spec import ModelSpec

    spec = ModelSpec.from_pretrained(model_dir)
    model = AutoModelForImageTextToText.from_pretrained(model_dir)
    assert spec.vision.params == sum(p.numel() for p in model.model.visual.parameters())
    assert spec.num_params == sum(p.numel() for p in model.parameters())


def test_model_spec_of_qwen25_vl_3b_hub_config_counts_every_weight():
    """The hub's flat config.json layout (text keys at the top, vision_config nested), counted against the
    model transformers builds from it (on the meta device: no memory)."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    from verl.compat.planning.model_spec import ModelSpec

    hub = QWEN25_VL_3B_HUB
    spec = ModelSpec.from_hf_config(hub)
    with torch.device("meta"):
        model = Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(**hub))
    assert spec.num_params == sum(p.numel() for p in model.parameters())
    assert spec.vision.params == sum(p.numel() for p in model.model.visual.parameters())
    assert spec.hidden_size == 2048 and spec.num_layers == 36 and spec.vocab_size == 151936
