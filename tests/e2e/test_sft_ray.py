"""`sft_trainer_ray` on 2 CPU ranks (Ray workers, gloo) against `sft_trainer` in one process.

The one process batches by token budget, the two ranks by fixed micro-batches of 2 rows.

The same global batches, the loss normalised by the batch's tokens over all ranks: losses and gradient
norms agree up to float32 summation order (1e-4 relative) on both steps, the second after an update.
"""
import json
import os
import subprocess
import sys

import pandas as pd
import pytest
from conftest import REPO_ROOT
from test_sft_then_grpo import _rows


def _sft(module: str, model, root, name: str, ranks: int, steps: int = 2, *extra: str,
         launcher: tuple = ()) -> tuple[dict, str]:
    """Run an SFT entry point on root/train.parquet (after `launcher`'s arguments, e.g. torchrun's): ({step:
    metrics} of its file log root/<name>.jsonl, stdout)."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["VERL_FILE_LOGGER_PATH"] = str(root / f"{name}.jsonl")
    proc = subprocess.run([
        sys.executable, *launcher, "-m", module, f"model.path={model}", f"data.train_files={root / 'train.parquet'}",
        "data.train_batch_size=8", "data.micro_batch_size_per_gpu=2", "data.max_length=128", "optim.lr=1e-2",
        f"trainer.total_training_steps={steps}", "trainer.logger=[console,file]", f"trainer.n_gpus_per_node={ranks}",
        f"trainer.default_local_dir={root / name}", "checkpoint.save_contents=[model,optimizer,extra]",
        f"hydra.run.dir={root / 'hydra' / name}", *extra,
    ], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    if proc.returncode != 0:
        print(proc.stdout[-4000:])
        print(proc.stderr[-4000:], file=sys.stderr)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = (root / f"{name}.jsonl").read_text().splitlines()
    return {r["step"]: r["data"] for r in map(json.loads, lines)}, proc.stdout


def test_two_ray_ranks_match_one_process(copy_task, tmp_path):
    model = copy_task[0]
    pd.DataFrame({"messages": _rows(16)}).to_parquet(tmp_path / "train.parquet")
    one, _ = _sft("verl.trainer.sft_trainer", model, tmp_path, "one", 1)
    # one process with token-budgeted micro-batches (upstream's default), two ranks with fixed ones of 2 rows
    two, _ = _sft("verl.trainer.sft_trainer_ray", model, tmp_path, "two", 2, 2, "data.use_dynamic_bsz=False")
    assert sorted(one) == sorted(two) == [1, 2]
    for step in (1, 2):
        for key in ("train/loss", "train/grad_norm", "train/global_tokens"):
            assert two[step][key] == pytest.approx(one[step][key], rel=1e-4), (step, key)
    assert sorted(os.listdir(tmp_path / "two" / "global_step_2")) == [
        "extra_state_world_size_2_rank_0.pt", "extra_state_world_size_2_rank_1.pt", "fsdp_config.json", "huggingface",
        "model_world_size_2_rank_0.pt", "model_world_size_2_rank_1.pt", "optim_world_size_2_rank_0.pt",
        "optim_world_size_2_rank_1.pt"]


def test_torchrun_ranks_follow_the_launcher_with_upstreams_overrides(copy_task, tmp_path):
    """`torchrun --nproc_per_node=2 -m verl.trainer.sft_trainer` as upstream's SFT scripts run it: trainer.n_gpus_per_node
    left at 1 (the plan follows torchrun's two ranks), `engine=fsdp optim=fsdp` group choices, validation and
    saving `after_each_epoch`. Losses and gradient norms equal one process's (1e-4); the epoch's last step
    validates and saves a two-rank checkpoint."""
    model = copy_task[0]
    pd.DataFrame({"messages": _rows(16)}).to_parquet(tmp_path / "train.parquet")
    one, _ = _sft("verl.trainer.sft_trainer", model, tmp_path, "one", 1)
    upstream = ("engine=fsdp", "optim=fsdp", f"data.val_files={tmp_path / 'train.parquet'}", "data.use_dynamic_bsz=False",
                "trainer.test_freq=after_each_epoch", "trainer.save_freq=after_each_epoch")
    two, out = _sft("verl.trainer.sft_trainer", model, tmp_path, "torchrun", 1, 2, *upstream,
                    launcher=("-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"))
    assert sorted(one) == sorted(two) == [1, 2]
    for step in (1, 2):
        for key in ("train/loss", "train/grad_norm", "train/global_tokens"):
            assert two[step][key] == pytest.approx(one[step][key], rel=1e-4), (step, key)
    assert "val/loss" in two[2] and "val/loss" not in two[1]   # 16 rows, batches of 8: the epoch ends at step 2
    assert "model_world_size_2_rank_1.pt" in os.listdir(tmp_path / "torchrun" / "global_step_2")


def test_ulysses_ranks_split_each_sequence_and_train_as_one_process(copy_task, tmp_path):
    """engine.ulysses_sequence_parallel_size=2 on two torchrun ranks (one Ulysses group: both ranks take every row
    and half of each sequence, attention exchanged all-to-all), gradient checkpointing on (its recompute runs in
    the split layout): losses, gradient norms, token counts and the validation loss equal one process's (1e-4)."""
    model = copy_task[0]
    pd.DataFrame({"messages": _rows(16)}).to_parquet(tmp_path / "train.parquet")
    common = (f"data.val_files={tmp_path / 'train.parquet'}", "trainer.test_freq=2", "model.enable_gradient_checkpointing=True")
    one, _ = _sft("verl.trainer.sft_trainer", model, tmp_path, "one", 1, 2, *common)
    split, out = _sft("verl.trainer.sft_trainer", model, tmp_path, "sp", 1, 2, *common,
                      "engine.ulysses_sequence_parallel_size=2",
                      launcher=("-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"))
    assert "sequence split over 2 ranks (Ulysses)" in out
    for step in (1, 2):
        for key in ("train/loss", "train/grad_norm", "train/global_tokens"):
            assert split[step][key] == pytest.approx(one[step][key], rel=1e-4), (step, key)
    assert split[2]["val/loss"] == pytest.approx(one[2]["val/loss"], rel=1e-4)
