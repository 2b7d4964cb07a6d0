"""Bad inputs stop `main_ppo` in the driver before Ray starts, all reported in one message (exit status 2)."""
import importlib.util
import json

from conftest import run_main_ppo


def test_bad_data_and_logger_fail_before_ray_in_one_message(demo_task, tmp_path):
    model, train, _ = demo_task
    folder = tmp_path / "data"
    folder.mkdir()
    csv = tmp_path / "train.csv"
    csv.write_text("prompt\nhi\n")
    raw = tmp_path / "test.jsonl"
    raw.write_text(json.dumps({"question": "2+2?", "answer": "#### 4"}) + "\n")
    loggers = "[console,wandb]" if importlib.util.find_spec("wandb") is None else "[console]"
    proc, _ = run_main_ppo([f"data.train_files=[{folder},{csv}]", f"data.val_files={raw}",
                            f"actor_rollout_ref.model.path={model}", f"critic.model.path={model}",
                            f"trainer.logger={loggers}", "trainer.n_gpus_per_node=1",
                            "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
                            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=auto",
                            "critic.ppo_micro_batch_size_per_gpu=auto",
                            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=auto"], timeout=120)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "ray.init(" not in proc.stdout and "Traceback" not in proc.stderr
    message = proc.stderr[proc.stderr.index("verl: input error"):]
    assert f"{folder} is a folder, not a file" in message
    assert "is CSV" in message
    assert "examples/data_preprocess/gsm8k.py" in message
    if "wandb" in loggers:
        assert "pip install wandb" in message


def test_an_error_only_reading_the_data_finds_stops_the_run_before_ray(demo_task):
    """Over-long prompts (no filter, no truncation) are found by reading the data set, which happens before
    Ray starts: the input error's message and status, and no ray.init."""
    model, train, test = demo_task
    proc, _ = run_main_ppo([f"data.train_files={train}", f"data.val_files={test}",
                            f"actor_rollout_ref.model.path={model}", f"critic.model.path={model}",
                            "trainer.logger=[console]", "trainer.n_gpus_per_node=1", "data.max_prompt_length=4",
                            "data.max_response_length=4", "data.filter_overlong_prompts=False",
                            "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
                            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
                            "critic.ppo_micro_batch_size_per_gpu=8",
                            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8"], timeout=180)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "ray.init(" not in proc.stdout
    message = proc.stderr[proc.stderr.index("verl: input error (found before training started)"):]
    assert "over data.max_prompt_length=4" in message and "data.filter_overlong_prompts=True" in message
    assert "Training Progress" not in proc.stdout + proc.stderr
