"""SFT with LoRA through the stock `python -m verl.trainer.sft_trainer` (upstream's `model.lora_rank`,
`model.lora_alpha`, `model.target_modules`): only the adapters train, the checkpoint holds them in
upstream's layout (peft's names in the shards, `lora_train_meta.json`), and both ways main_ppo starts from
it give the same model: the merged `huggingface/` folder (`actor_rollout_ref.model.path`) and the base
plus the merger's `lora_adapter/` (`actor_rollout_ref.model.lora_adapter_path`).
"""
import json
import os
import subprocess
import sys

import pandas as pd
import pytest
import torch
from conftest import REPO_ROOT, _make_task

pytest.importorskip("peft", reason="LoRA needs peft (pip install 'verl[peft]')")

STEPS = 6


def _rows(n: int) -> list:
    prompt = _make_task().prompt_text
    return [[{"role": "user", "content": prompt(str(i % 10))}, {"role": "assistant", "content": str(i % 10) * 8}]
            for i in range(n)]


@pytest.fixture(scope="module")
def lora_sft(copy_task, tmp_path_factory):
    model, _, _ = copy_task
    root = tmp_path_factory.mktemp("sft_lora")
    pd.DataFrame({"messages": _rows(8)}).to_parquet(root / "train.parquet")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["VERL_FILE_LOGGER_PATH"] = str(root / "sft.jsonl")
    proc = subprocess.run([
        sys.executable, "-m", "verl.trainer.sft_trainer", f"model.path={model}", "model.lora_rank=8",
        "model.lora_alpha=16", "model.target_modules=all-linear", f"data.train_files={root / 'train.parquet'}",
        "data.train_batch_size=8", "data.micro_batch_size_per_gpu=4", "data.max_length=128", "optim.lr=1e-2",
        f"trainer.total_training_steps={STEPS}", "trainer.logger=[console,file]",
        f"trainer.default_local_dir={root / 'ckpt'}", "trainer.save_freq=-1", f"hydra.run.dir={root / 'hydra'}",
    ], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = {}
    for line in (root / "sft.jsonl").read_text().splitlines():
        record = json.loads(line)
        steps[record["step"]] = record["data"]
    return model, root / "ckpt" / f"global_step_{STEPS}", proc, steps


def test_lora_sft_lowers_the_loss_and_trains_only_the_adapters(lora_sft):
    from transformers import AutoModelForCausalLM

    model, step_dir, proc, steps = lora_sft
    assert "lora" in proc.stdout.lower()   # the printed plan says what trains
    assert sorted(steps) == list(range(1, STEPS + 1))
    losses = [steps[k]["train/loss"] for k in range(1, STEPS + 1)]   # every step sees the same 8 rows
    assert all(b < a for a, b in zip(losses, losses[1:])), losses
    assert losses[-1] < 0.95 * losses[0], losses
    start = AutoModelForCausalLM.from_pretrained(model).state_dict()
    shard = torch.load(step_dir / "model_world_size_1_rank_0.pt")
    assert all(k.startswith("base_model.model.") for k in shard)   # peft's names, as upstream's shards
    frozen = {k: v for k, v in shard.items() if ".lora_" not in k}
    lora_b = {k: v for k, v in shard.items() if ".lora_B." in k}
    assert len(frozen) >= len(start) - 1 and len(lora_b) == 7 * 2   # q k v o gate up down, 2 layers
    for key, value in frozen.items():
        assert torch.equal(value, start[key.removeprefix("base_model.model.").replace(".base_layer.", ".")]), key
    assert all(v.abs().max() > 0 for v in lora_b.values())   # B starts at zero: every adapter trained
    assert json.loads((step_dir / "lora_train_meta.json").read_text()) == {"r": 8, "lora_alpha": 16,
                                                                         "task_type": "CAUSAL_LM"}


def test_merged_folder_and_adapter_folder_are_the_same_model(lora_sft, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from verl.model_merger.__main__ import main as merger_main   # the stock command, in this process

    model, step_dir, _, _ = lora_sft
    target = tmp_path / "merged"
    assert merger_main(["merge", "--backend", "fsdp", "--local_dir", str(step_dir), "--target_dir", str(target)]) == 0
    ids = torch.tensor([[1, 5, 9, 13, 17, 21, 25, 29]])
    with torch.no_grad():
        merged = AutoModelForCausalLM.from_pretrained(step_dir / "huggingface", dtype=torch.float32)(ids).logits
        base = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
        adapted = PeftModel.from_pretrained(base, target / "lora_adapter")(ids).logits
        plain = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)(ids).logits
    assert torch.allclose(merged, adapted, atol=1e-4)
    assert not torch.allclose(merged, plain, atol=1e-3)
