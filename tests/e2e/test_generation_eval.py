"""`main_generation_server` on 8 prompts, then `main_eval` on its output, both as subprocesses (CPU).

Sampling with top_k=1 is greedy, so each of the n=2 samples must equal transformers' own greedy
`generate` of the same chat prompt; main_eval's score must equal the reward function applied by hand.
"""
import ast
import os
import subprocess
import sys

import pandas as pd
import pytest
import torch
from conftest import REPO_ROOT

RESPONSE_LEN = 8


def _run(module: str, overrides: list[str], timeout: int = 300):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.run([sys.executable, "-m", module, *overrides], cwd=REPO_ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        print(proc.stdout[-4000:])
        print(proc.stderr[-4000:], file=sys.stderr)
    return proc


@pytest.fixture(scope="module")
def generated(copy_task, tmp_path_factory):
    model, train, _ = copy_task
    root = tmp_path_factory.mktemp("gen")
    prompts = root / "prompts.parquet"
    pd.read_parquet(train).head(8).to_parquet(prompts)
    out = root / "out" / "gen.parquet"
    proc = _run("verl.trainer.main_generation_server", [
        f"data.train_files={prompts}", f"+data.output_path={out}", "data.prompt_key=prompt",
        "data.max_prompt_length=48", f"data.max_response_length={RESPONSE_LEN}", "data.train_batch_size=4",
        f"actor_rollout_ref.model.path={model}", "actor_rollout_ref.rollout.name=hf",
        "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.rollout.temperature=1.0",
        "actor_rollout_ref.rollout.top_k=1", "trainer.n_gpus_per_node=1", "trainer.nnodes=1",
    ])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return model, prompts, out


def _greedy(model_dir, messages) -> str:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**ids, do_sample=False, max_new_tokens=RESPONSE_LEN, eos_token_id=tok.eos_token_id,
                             pad_token_id=tok.pad_token_id)
    return tok.decode(out[0, ids["input_ids"].shape[-1]:], skip_special_tokens=True)


def test_generation_writes_n_greedy_responses_per_prompt(generated):
    model, prompts, out = generated
    table, source = pd.read_parquet(out), pd.read_parquet(prompts)
    assert len(table) == 8
    assert list(table.columns) == [*source.columns, "responses"]
    assert table["data_source"].tolist() == source["data_source"].tolist()
    assert sum(bool(r[0]) for r in table["responses"]) >= 4   # text to compare, not empty strings
    for row in table.itertuples():
        assert len(row.responses) == 2
        messages = [dict(m) for m in row.prompt]
        expected = _greedy(model, messages)
        assert list(row.responses) == [expected, expected]


def test_main_eval_scores_the_generated_file(generated, tmp_path):
    sys.path.insert(0, str(REPO_ROOT / "examples" / "demo"))
    try:
        from reward import compute_score
    finally:
        sys.path.pop(0)
    _, _, out = generated
    proc = _run("verl.trainer.main_eval", [f"data.path={out}", "custom_reward_function.path=examples/demo/reward.py",
                                            "ray_kwargs.ray_init.num_cpus=2", f"hydra.run.dir={tmp_path}"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = ast.literal_eval(proc.stdout.strip().splitlines()[-1])
    table = pd.read_parquet(out)
    rows = [sum(compute_score(r.data_source, s, r.reward_model["ground_truth"]) for s in r.responses) / 2
            for r in table.itertuples()]
    assert list(metrics) == ["test_score/demo/repeat_digit"]
    assert metrics["test_score/demo/repeat_digit"] == pytest.approx(sum(rows) / len(rows), abs=1e-12)


def test_main_eval_names_a_missing_column(generated, tmp_path):
    _, prompts, _ = generated
    proc = _run("verl.trainer.main_eval", [f"data.path={prompts}", f"hydra.run.dir={tmp_path}"], timeout=120)
    assert proc.returncode == 2
    assert "no column for data.response_key='responses'" in proc.stderr
