"""Worker checkpoints on CPU: save, perturb (another update), load -> identical weights, optimizer state,
LR and RNG, at world size 1 and with two gloo ranks; upstream's file names; the huggingface/ folder;
atomic saves and retention. Everything is compared exactly: a load copies the saved bits back.
"""
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from worker_setup import (  # noqa: E402
    actor_rollout_ref_config,
    cpu_plan,
    critic_config,
    optim,
    ppo_batch,
    run_ranks,
    tiny_model,
)

from verl.utils.checkpoint.checkpoint_manager import find_latest_ckpt_path, write_tracker  # noqa: E402
from verl.workers.fsdp_workers import ActorRolloutRefWorker, CriticWorker  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model(str(tmp_path_factory.mktemp("tiny_qwen2_ckpt")))


def _actor(model_dir, **checkpoint):
    # warm-up makes the LR change every step, so a restored scheduler is visible in the LR
    config = actor_rollout_ref_config(model_dir, optim={**optim(), "lr_warmup_steps": 5},
                                      checkpoint={"save_contents": ["model", "optimizer", "extra"], **checkpoint})
    worker = ActorRolloutRefWorker(config, role="actor", plan=cpu_plan(model_dir))
    worker.init_model()
    return worker


def _train(worker, seed):
    data = ppo_batch(batch_size=4, seed=seed)
    data.batch["old_log_probs"] = worker.compute_log_prob(data).batch["old_log_probs"]
    return worker.update_actor(data)


def _snapshot(worker) -> dict:
    def local(t):
        return (t.to_local() if hasattr(t, "to_local") else t).detach().clone()

    opt = worker.actor_optimizer.state_dict()
    return {
        "params": {k: local(v) for k, v in worker.actor_module.state_dict().items()},
        "optim": {i: {k: local(v) for k, v in s.items()} for i, s in opt["state"].items()},
        "lr": worker.actor_lr_scheduler.get_last_lr()[0],
        "rng": torch.rand(3),
    }


def _same(a: dict, b: dict) -> bool:
    return (a["lr"] == b["lr"] and torch.equal(a["rng"], b["rng"])
            and all(torch.equal(a["params"][k], b["params"][k]) for k in a["params"])
            and a["optim"].keys() == b["optim"].keys()
            and all(torch.equal(a["optim"][i][k], b["optim"][i][k]) for i in a["optim"] for k in a["optim"][i]))


def perturb_and_restore(model_dir: str, ckpt_dir: str) -> dict:
    """Shared by the one-rank test and each rank of the two-rank one."""
    worker = _actor(model_dir)
    rank = int(os.environ.get("RANK", 0))
    _train(worker, seed=rank)
    path = os.path.join(ckpt_dir, "global_step_1", "actor")
    worker.save_checkpoint(path, global_step=1)
    rng = torch.get_rng_state()
    before = _snapshot(worker)
    torch.set_rng_state(rng)
    _train(worker, seed=10 + rank)
    changed = not _same(before, _snapshot(worker))
    torch.manual_seed(123)
    worker.load_checkpoint(path)
    return {"changed_by_training": changed, "restored": _same(before, _snapshot(worker)),
            "files": sorted(os.listdir(path))}


def test_actor_round_trip_restores_weights_optimizer_lr_and_rng(model_dir, tmp_path):
    result = perturb_and_restore(model_dir, str(tmp_path))
    assert result["changed_by_training"] and result["restored"]
    assert result["files"] == ["extra_state_world_size_1_rank_0.pt", "fsdp_config.json", "huggingface",
                               "model_world_size_1_rank_0.pt", "optim_world_size_1_rank_0.pt"]
    hf = os.listdir(tmp_path / "global_step_1" / "actor" / "huggingface")
    assert "config.json" in hf and "tokenizer_config.json" in hf and not any(f.endswith(".safetensors") for f in hf)


def test_two_gloo_ranks_round_trip(model_dir, tmp_path):
    import json

    run_ranks(lambda rank: [os.path.join(HERE, "ckpt_runner.py"), model_dir, str(tmp_path),
                            str(tmp_path / f"r{rank}.json")], world=2)
    for rank in range(2):
        result = json.loads((tmp_path / f"r{rank}.json").read_text())
        assert result["changed_by_training"] and result["restored"], rank
    files = sorted(os.listdir(tmp_path / "global_step_1" / "actor"))
    assert [f for f in files if f.startswith("model_")] == ["model_world_size_2_rank_0.pt",
                                                            "model_world_size_2_rank_1.pt"]


def test_critic_round_trip_and_hf_weights(model_dir, tmp_path):
    from transformers import AutoModelForTokenClassification

    config = critic_config(model_dir, checkpoint={"save_contents": ["model", "optimizer", "extra", "hf_model"]})
    worker = CriticWorker(config, plan=cpu_plan(model_dir))
    worker.init_model()
    data = ppo_batch(batch_size=4)
    data.batch["values"] = worker.compute_values(data).batch["values"]
    worker.update_critic(data)
    path = str(tmp_path / "global_step_1" / "critic")
    worker.save_checkpoint(path, global_step=1)
    saved = {k: (v.to_local() if hasattr(v, "to_local") else v).clone() for k, v in worker.critic_module.state_dict().items()}
    worker.update_critic(data)
    worker.load_checkpoint(path)
    assert all(torch.equal(v.to_local() if hasattr(v, "to_local") else v, saved[k]) for k, v in worker.critic_module.state_dict().items())
    hf = AutoModelForTokenClassification.from_pretrained(os.path.join(path, "huggingface"))
    hf_state = hf.state_dict()
    assert set(saved) <= set(hf_state)
    assert all(torch.equal(hf_state[k], saved[k]) for k in saved)   # one rank: the shard is the whole tensor


def test_a_failed_save_leaves_the_previous_checkpoint_in_charge(model_dir, tmp_path, monkeypatch):
    worker = _actor(model_dir)
    worker.save_checkpoint(str(tmp_path / "global_step_1" / "actor"), global_step=1)
    write_tracker(str(tmp_path), 1)
    real_save = torch.save

    def fail_on_optimizer(obj, path, *args, **kwargs):
        if "optim_world_size" in str(path):
            raise OSError("disk full")
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(torch, "save", fail_on_optimizer)
    with pytest.raises(OSError, match="disk full"):
        worker.save_checkpoint(str(tmp_path / "global_step_2" / "actor"), global_step=2)
    assert find_latest_ckpt_path(str(tmp_path)) == str(tmp_path / "global_step_1")
    assert not (tmp_path / "global_step_2" / "actor").exists()       # only the .partial folder is left
    monkeypatch.setattr(torch, "save", real_save)
    worker.save_checkpoint(str(tmp_path / "global_step_2" / "actor"), global_step=2)  # a retry replaces it
    assert sorted(os.listdir(tmp_path / "global_step_2")) == ["actor"]


def test_retention_keeps_the_newest_and_the_tracked_step(model_dir, tmp_path):
    worker = _actor(model_dir)
    root = str(tmp_path)
    for step in (1, 2, 3):
        worker.save_checkpoint(os.path.join(root, f"global_step_{step}", "actor"), global_step=step,
                               max_ckpt_to_keep=1)
        if step < 3:
            write_tracker(root, step)
    # step 2 is still what the tracker names (the trainer moves it after the whole save), so it stays
    assert sorted(os.listdir(root)) == ["global_step_2", "global_step_3", "latest_checkpointed_iteration.txt"]


def test_unknown_save_contents_is_refused(model_dir):
    with pytest.raises(ValueError, match="unknown items"):
        _actor(model_dir, save_contents=["model", "weights"])


def test_the_rollout_sampling_stream_is_restored(model_dir, tmp_path):
    """A sampled rollout after a resume draws what the uninterrupted run drew (the engine's own generator
    travels in the extra state, next to python/numpy/torch)."""
    from worker_setup import PROMPT_LEN

    from verl.protocol import DataProto

    config = actor_rollout_ref_config(model_dir, checkpoint={"save_contents": ["model", "optimizer", "extra"]})
    worker = ActorRolloutRefWorker(config, role="actor_rollout", plan=cpu_plan(model_dir))
    worker.init_model()
    data = ppo_batch(batch_size=4)
    prompts = DataProto.from_dict({k: data.batch[k][:, :PROMPT_LEN] for k in ("input_ids", "attention_mask",
                                                                              "position_ids")},
                                  meta_info={"eos_token_id": 10 ** 6, "do_sample": True})
    worker.generate_sequences(prompts)                     # the stream has moved before the save
    path = str(tmp_path / "global_step_1" / "actor")
    worker.save_checkpoint(path, global_step=1)
    expected = worker.generate_sequences(prompts).batch["responses"]
    again = worker.generate_sequences(prompts).batch["responses"]
    assert not torch.equal(expected, again)                # sampling: the stream really differs per call
    worker.load_checkpoint(path)
    assert torch.equal(worker.generate_sequences(prompts).batch["responses"], expected)


def test_a_save_without_room_stops_before_writing_and_names_folder_and_sizes(model_dir, tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    worker = _actor(model_dir)
    shards = sum(t.numel() * t.element_size() for t in worker.actor_module.state_dict().values())
    usage = namedtuple("Usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(1 << 40, 1 << 40, 1 << 20))
    target = tmp_path / "global_step_1" / "actor"
    with pytest.raises(OSError, match=rf"not enough disk space to save the checkpoint {target}: it needs about "
                                      r"[\d.]+ MiB, and 1\.00 MiB are free") as caught:
        worker.save_checkpoint(str(target), global_step=1)
    assert caught.value.needed > 2 * shards          # weights plus two Adam moments
    assert not (tmp_path / "global_step_1").exists()


def test_a_disk_that_fills_during_a_worker_save_leaves_nothing_behind(model_dir, tmp_path, monkeypatch):
    import errno

    worker = _actor(model_dir)
    real_save = torch.save

    def full_disk(obj, path, *args, **kwargs):
        if "optim_world_size" in str(path):
            open(path, "wb").write(b"x" * 1000)
            raise RuntimeError("[enforce fail at inline_container.cc:626] . unexpected pos 64 vs 0: basic_ios::clear: "
                               "iostream error")   # what torch raises when the disk fills mid-file
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(torch, "save", full_disk)
    target = tmp_path / "global_step_1" / "actor"
    with pytest.raises(OSError, match=rf"ran out of disk space while saving the checkpoint {target}") as caught:
        worker.save_checkpoint(str(target), global_step=1)
    assert caught.value.errno == errno.ENOSPC and caught.value.free > 0
    assert os.listdir(tmp_path) == []                # neither the .partial folder nor an empty step folder
