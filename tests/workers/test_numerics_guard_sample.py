"""The workers' fp16 numerics guard looks at a few real rows of the first batch, never all of it
(the first batch can be the whole validation set), and still catches an overflowing model."""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from worker_setup import (
    actor_rollout_ref_config,
    cpu_plan,
    ppo_batch,
    run_ranks,
    tiny_model,
)

from verl.compat.apply import numerics
from verl.workers.fsdp_workers import ActorRolloutRefWorker


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model(str(tmp_path_factory.mktemp("tiny_qwen2_guard")))


def _fp16_actor(model_dir):
    plan = cpu_plan(model_dir, device="t4")
    worker = ActorRolloutRefWorker(actor_rollout_ref_config(model_dir), role="actor", plan=plan)
    worker.init_model()
    return worker


def test_guard_gets_at_most_guard_rows_real_rows(model_dir, monkeypatch):
    seen = []
    real = numerics.check_half_precision

    def spy(model, batch, dtype):
        seen.append({k: v.clone() for k, v in batch.items()})
        return real(model, batch, dtype)

    monkeypatch.setattr(numerics, "check_half_precision", spy)
    data = ppo_batch(batch_size=24)
    data.batch["attention_mask"][0] = 0                    # a row of only padding: skipped
    worker = _fp16_actor(model_dir)
    out = worker.compute_log_prob(data)
    worker.compute_log_prob(data)                          # the guard runs once per role
    assert len(seen) == 1
    sample = seen[0]
    assert sample["input_ids"].shape[0] == numerics.GUARD_ROWS < len(data)
    torch.testing.assert_close(sample["input_ids"], data.batch["input_ids"][1 : 1 + numerics.GUARD_ROWS])
    assert (sample["attention_mask"].sum(-1) > 1).all()
    assert "compat_notes" not in out.meta_info             # the tiny model is healthy in float16
    assert worker._actor_model.precision.autocast_dtype == torch.float16


def test_guard_on_a_sample_still_catches_an_overflow(model_dir):
    worker = _fp16_actor(model_dir)
    with torch.no_grad():
        worker.actor_module.model.norm.weight.mul_(1e6)   # final hidden states far beyond 65504
    out = worker.compute_log_prob(ppo_batch(batch_size=24))
    note = out.meta_info["compat_notes"][0]
    assert "non-finite" in note and note.startswith("plan updated: actor.compute_dtype float16 -> float32")
    assert worker._actor_model.precision.autocast_dtype is None
    assert worker._actor_model.precision.scaler is None
    assert torch.isfinite(out.batch["old_log_probs"]).all()


RANK_SCRIPT = """
import json, sys
import torch
sys.path.insert(0, WORKER_SETUP_DIR)
from worker_setup import close_process_group
from verl.utils import fsdp_utils
from verl.workers import fsdp_workers

rank, _ = fsdp_utils.init_distributed("gloo", timeout_s=60)
rows = 3 if rank == 0 else 1
sample = {"input_ids": torch.arange(rows).unsqueeze(-1) + 10 * rank, "attention_mask": torch.ones(rows, 1)}
sample = fsdp_workers._same_row_count_on_every_rank(sample)
ok, reason = fsdp_workers._agreed_verdict(rank == 0, f"rank {rank}'s own reason")
json.dump({"ids": sample["input_ids"].flatten().tolist(), "ok": ok, "reason": reason}, open(sys.argv[1], "w"))
close_process_group()
"""


def test_ranks_agree_on_rows_and_verdict(tmp_path):
    """Every forward of sharded weights is a collective, so ranks run the same number of guard rows
    (a shorter sample repeats its rows), and one precision holds for all ranks (any failure wins)."""
    import json

    script = tmp_path / "rank.py"
    script.write_text(RANK_SCRIPT.replace("WORKER_SETUP_DIR", repr(os.path.dirname(os.path.abspath(__file__)))))
    run_ranks(lambda rank: [str(script), str(tmp_path / f"{rank}.json")], world=2, timeout=120)
    first, second = (json.loads((tmp_path / f"{r}.json").read_text()) for r in range(2))
    assert first["ids"] == [0, 1, 2] and second["ids"] == [10, 10, 10]
    # the same reason on every rank, so each re-issues the same plan (and their outputs' meta agree)
    assert first["ok"] is False and second["ok"] is False
    assert first["reason"] == second["reason"] == "rank 1's sample: rank 1's own reason"
