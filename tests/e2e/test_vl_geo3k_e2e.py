"""Upstream's geo3k GRPO recipe (Qwen2.5-VL) through the stock `python -m verl.trainer.main_ppo`, CPU-sized.

Upstream's examples/grpo_trainer/run_qwen2_5_vl-7b.sh runs GRPO on examples/data_preprocess/geo3k.py's
output with data.image_key=images. Here: the same keys, a tiny random Qwen2.5-VL built locally, geo3k-shaped
data with generated images (preprocessed by the stock script), the built-in engine, two steps, a checkpoint
at the last one, and the stock model merger over it.
"""
import torch

from conftest import console_metrics, run_main_ppo
from vision_data import geo3k_parquet, tiny_vl_model


def geo3k_command(data, model, checkpoints) -> list[str]:
    return [
        "algorithm.adv_estimator=grpo",
        f"data.train_files={data}/train.parquet",
        f"data.val_files={data}/test.parquet",
        "data.train_batch_size=2",
        "data.max_prompt_length=96",
        "data.max_response_length=8",
        "data.filter_overlong_prompts=True",
        "data.truncation=error",
        "data.image_key=images",
        f"actor_rollout_ref.model.path={model}",
        "actor_rollout_ref.actor.optim.lr=1e-3",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        "actor_rollout_ref.actor.use_kl_loss=True",
        "actor_rollout_ref.actor.kl_loss_coef=0.01",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl",
        "actor_rollout_ref.actor.entropy_coeff=0",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
        "algorithm.use_kl_in_reward=False",
        "trainer.critic_warmup=0",
        "trainer.logger=console",
        "trainer.val_before_train=False",
        "trainer.n_gpus_per_node=1",
        "trainer.nnodes=1",
        "trainer.save_freq=2",
        "trainer.test_freq=2",
        "trainer.total_training_steps=2",
        f"trainer.default_local_dir={checkpoints}",
    ]


def test_geo3k_grpo_two_steps_checkpoint_and_merge(tmp_path):
    model = tiny_vl_model(tmp_path / "model")
    data = geo3k_parquet(tmp_path, rows_per_split=4)
    checkpoints = tmp_path / "checkpoints"
    proc, _ = run_main_ppo(geo3k_command(data, model, checkpoints), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = console_metrics(proc.stdout)
    assert sorted(steps) == [1, 2]
    for metric in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "timing_s/gen", "timing_s/update_actor"):
        assert metric in steps[1], metric
    assert "val-core/hiyouga/geometry3k/reward/mean@1" in steps[2]
    # the plan printed the vision tower's decisions
    assert "vision.frozen:" in proc.stdout and "vision.memory:" in proc.stdout
    # image tokens are in the prompt lengths: 4 per 56x56 image, on top of the text
    assert steps[1]["prompt_length/mean"] > 4

    hf = checkpoints / "global_step_2" / "actor" / "huggingface"
    for name in ("preprocessor_config.json", "processor_config.json", "chat_template.jinja", "tokenizer.json"):
        assert (hf / name).is_file(), name

    from verl.model_merger.__main__ import main as merger_main   # the stock command, in this process
    from verl.workers.model_building.loading import load_processor

    target = tmp_path / "merged"
    assert merger_main(["merge", "--backend", "fsdp", "--local_dir", str(hf.parent),
                        "--target_dir", str(target)]) == 0
    processor = load_processor(str(target))
    assert processor is not None and processor.image_processor.merge_size == 2
    from transformers import AutoModelForImageTextToText

    merged = AutoModelForImageTextToText.from_pretrained(target)
    start = AutoModelForImageTextToText.from_pretrained(model)
    trained = dict(merged.named_parameters())
    assert any(not torch.equal(p, trained[n]) for n, p in start.named_parameters())   # the update moved weights
    assert set(trained) == {n for n, _ in start.named_parameters()}


def test_geo3k_row_without_its_image_stops_before_ray(tmp_path):
    import pyarrow.parquet as pq

    model = tiny_vl_model(tmp_path / "model")
    data = geo3k_parquet(tmp_path, rows_per_split=4)
    table = pq.read_table(data / "train.parquet").to_pylist()
    table[3]["images"] = []
    import pyarrow as pa

    pq.write_table(pa.Table.from_pylist(table, schema=pq.read_schema(data / "train.parquet")), data / "train.parquet")
    proc, _ = run_main_ppo(geo3k_command(data, model, tmp_path / "checkpoints"), timeout=120)
    assert proc.returncode != 0
    output = proc.stdout + proc.stderr
    assert "data.train_files: row 3 of" in output and "holds 0 image(s)" in output
    assert "Started a local Ray instance" not in output
