"""SFT through the stock `python -m verl.trainer.sft_trainer`, then GRPO through `main_ppo` from its output.

SFT data: the copy task's prompts answered correctly ("Repeat after me: 7 7 ..." -> "77777777"), single-
and multi-turn rows. The SFT checkpoint's huggingface/ folder must be a model that learned (lower NLL of
the answers than the starting model) and that main_ppo starts from unchanged.
"""
import json
import os
import subprocess
import sys

import pandas as pd
import pytest
import torch
from conftest import REPO_ROOT, _make_task, run_main_ppo

STEPS = 8


def _rows(n: int) -> list:
    prompt = _make_task().prompt_text
    rows = []
    for i in range(n):
        d, e = str(i % 10), str((i + 3) % 10)
        turn = [{"role": "user", "content": prompt(d)}, {"role": "assistant", "content": d * 8}]
        if i % 2:   # multi-turn rows: a second exchange
            turn += [{"role": "user", "content": prompt(e)}, {"role": "assistant", "content": e * 8}]
        rows.append(turn)
    return rows


@pytest.fixture(scope="module")
def sft_run(copy_task, tmp_path_factory):
    model, _, _ = copy_task
    root = tmp_path_factory.mktemp("sft")
    pd.DataFrame({"messages": _rows(32)}).to_parquet(root / "train.parquet")
    pd.DataFrame({"messages": _rows(8)}).to_parquet(root / "val.parquet")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["VERL_FILE_LOGGER_PATH"] = str(root / "sft.jsonl")
    proc = subprocess.run([
        sys.executable, "-m", "verl.trainer.sft_trainer", f"model.path={model}",
        f"data.train_files={root / 'train.parquet'}", f"data.val_files={root / 'val.parquet'}",
        "data.train_batch_size=8", "data.micro_batch_size_per_gpu=4", "data.max_length=128",
        "optim.lr=3e-2", f"trainer.total_training_steps={STEPS}", "trainer.logger=[console,file]",
        f"trainer.default_local_dir={root / 'ckpt'}", "trainer.test_freq=4", "trainer.save_freq=4",
        "trainer.max_ckpt_to_keep=1", f"hydra.run.dir={root / 'hydra'}",
    ], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    if proc.returncode != 0:
        print(proc.stdout[-4000:])
        print(proc.stderr[-4000:], file=sys.stderr)
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = {}
    for line in (root / "sft.jsonl").read_text().splitlines():
        record = json.loads(line)
        steps[record["step"]] = record["data"]
    return model, root, proc, steps


def _answer_nll(model_dir, rows) -> float:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    total = 0.0
    for messages in rows:
        prompt = tok.apply_chat_template(messages[:1], add_generation_prompt=True, tokenize=False)
        ids = tok(prompt + messages[1]["content"], return_tensors="pt", add_special_tokens=False)["input_ids"]
        start = len(tok(prompt, add_special_tokens=False)["input_ids"])
        with torch.no_grad():
            logp = torch.log_softmax(model(ids).logits[0, :-1].double(), -1)
        total -= logp[torch.arange(start - 1, ids.shape[1] - 1), ids[0, start:]].sum().item()
    return total / len(rows)


def test_sft_learns_and_leaves_a_hugging_face_folder(sft_run):
    model, root, proc, steps = sft_run
    assert "verl.compat plan" in proc.stdout
    assert sorted(steps) == list(range(1, STEPS + 1))
    assert steps[STEPS]["train/loss"] < 0.5 * steps[1]["train/loss"]
    assert "val/loss" in steps[4] and "val/loss" in steps[8] and "val/loss" not in steps[1]
    # the step's time and memory peak under upstream's PPO names (on CPU the peak is the process's resident set)
    assert all(steps[s]["timing_s/step"] > 0 and steps[s]["perf/max_memory_allocated_gb"] > 0 for s in steps)
    ckpt = root / "ckpt"
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == str(STEPS)
    assert sorted(os.listdir(ckpt)) == ["global_step_8", "latest_checkpointed_iteration.txt"]  # keep 1
    hf = ckpt / "global_step_8" / "huggingface"
    rows = _rows(8)
    # the folder holds the trained weights: its answers' NLL well below the starting model's (the ratio depends on
    # how the tiny tokenizer, trained by the installed `tokenizers`, splits "77777777": 0.41 on current
    # releases, 0.59 on the floors of scripts/test_floor.sh)
    assert _answer_nll(hf, rows) < 0.7 * _answer_nll(model, rows)


def _greedy_scores(model_dir, table) -> list[float]:
    """The demo reward of transformers' own greedy answer (8 tokens) to each row of `table`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    sys.path.insert(0, str(REPO_ROOT / "examples" / "demo"))
    try:
        from reward import compute_score
    finally:
        sys.path.pop(0)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    scores = []
    for row in table.itertuples():
        ids = tok.apply_chat_template([dict(m) for m in row.prompt], add_generation_prompt=True,
                                      return_tensors="pt", return_dict=True)
        with torch.no_grad():   # transformers 4.56's tokenizer adds token_type_ids, which generate refuses
            out = model.generate(input_ids=ids["input_ids"], attention_mask=ids["attention_mask"], do_sample=False, max_new_tokens=8, eos_token_id=tok.eos_token_id,
                                 pad_token_id=tok.pad_token_id)
        answer = tok.decode(out[0, ids["input_ids"].shape[-1]:], skip_special_tokens=True)
        scores.append(compute_score(row.data_source, answer, row.reward_model["ground_truth"]))
    return scores


def test_grpo_starts_from_the_sft_output(sft_run, copy_task, tmp_path):
    """main_ppo loads the SFT folder itself: its greedy validation before training scores exactly what
    transformers' greedy answers of that folder score, and then trains 2 GRPO steps."""
    _, root, _, _ = sft_run
    _, train, test = copy_task
    hf = root / "ckpt" / "global_step_8" / "huggingface"
    val = pd.read_parquet(test).head(4)
    val.to_parquet(tmp_path / "val.parquet")
    proc, steps = run_main_ppo([
        f"data.train_files={train}", f"data.val_files={tmp_path / 'val.parquet'}", "data.train_batch_size=4",
        "data.max_prompt_length=48", "data.max_response_length=8", "data.dataloader_num_workers=0",
        "data.train_max_samples=8",
        f"actor_rollout_ref.model.path={hf}", "actor_rollout_ref.actor.optim.lr=1e-3",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8", "algorithm.adv_estimator=grpo",
        "custom_reward_function.path=examples/demo/reward.py", "trainer.logger=[console,file]",
        "trainer.val_before_train=True", "trainer.test_freq=-1", "trainer.save_freq=-1",
        "trainer.n_gpus_per_node=1", "trainer.nnodes=1", "trainer.total_epochs=10", "trainer.total_training_steps=2",
    ], log_path=tmp_path / "grpo.jsonl")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(steps) == [0, 1, 2]
    key = "val-core/demo/repeat_digit/reward/mean@1"
    expected = _greedy_scores(hf, val)
    assert steps[0][key] == pytest.approx(sum(expected) / len(expected), abs=1e-6)
    assert steps[0][key] > 0   # the SFT model answers with the asked digit at least in part
