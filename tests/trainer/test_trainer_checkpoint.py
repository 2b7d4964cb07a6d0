"""The trainer's side of checkpoints against scripted worker groups (no Ray, no models): when it saves,
the on-disk layout, that the tracker moves only after a complete save, that a NaN stop keeps the last
checkpoint, retention, and that a resumed run trains on exactly the batches the uninterrupted run did.
"""
import os
import re
import shutil

import pytest
import torch
from test_ray_trainer_loop import FakeWorkerGroup, collate_fn, make_config, make_dataset, reward_fn

from verl.trainer.ppo.ray_trainer import RayPPOTrainer, ResourcePoolManager, Role, TrainingDivergedError
from verl.utils.checkpoint.checkpoint_manager import CheckpointTrackerError
from verl.utils.checkpoint.plain_state import UnsafeCheckpointError


class CheckpointingGroup(FakeWorkerGroup):
    """Writes a marker file per save; can fail a save, or turn the loss NaN, at a chosen step."""

    def __init__(self, calls, fail_save_at=None, nan_at=None):
        super().__init__(calls)
        self.fail_save_at, self.nan_at = fail_save_at, nan_at
        self.step, self.prompts, self.loaded = 0, [], []

    def generate_sequences(self, gen_batch):
        self.step += 1
        self.pg_loss = float("nan") if self.step == self.nan_at else 0.5
        return super().generate_sequences(gen_batch)

    def update_actor(self, batch):
        self.prompts.append([info["index"] for info in batch.non_tensor_batch["extra_info"]])
        return super().update_actor(batch)

    def save_checkpoint(self, local_path, hdfs_path=None, global_step=0, max_ckpt_to_keep=None):
        if global_step == self.fail_save_at and local_path.endswith("critic"):
            raise OSError("disk full")
        os.makedirs(local_path, exist_ok=True)
        open(os.path.join(local_path, "model_world_size_1_rank_0.pt"), "w").close()

    def load_checkpoint(self, local_path, hdfs_path=None, del_local_after_load=False):
        self.loaded.append(local_path)


def trainer_for(tmp_path, steps, save_freq, **overrides):
    cfg = make_config(tmp_path, **{"trainer.val_before_train": False, "trainer.test_freq": -1,
                                   "trainer.total_epochs": 4, "trainer.total_training_steps": steps,
                                   "trainer.save_freq": save_freq, "trainer.balance_batch": False,
                                   **overrides})
    roles = {Role.ActorRollout: object, Role.Critic: object}
    pool = ResourcePoolManager(resource_pool_spec={"global_pool": [1]}, mapping={r: "global_pool" for r in roles})
    generator = torch.Generator().manual_seed(7)  # shuffled, as data.shuffle=True makes it
    trainer = RayPPOTrainer(config=cfg, tokenizer=type("T", (), {"eos_token_id": 9, "pad_token_id": 0})(),
                            role_worker_mapping=roles, resource_pool_manager=pool, reward_fn=reward_fn,
                            val_reward_fn=reward_fn, train_dataset=make_dataset(12), val_dataset=make_dataset(3),
                            collate_fn=collate_fn,
                            train_sampler=torch.utils.data.RandomSampler(range(12), generator=generator))
    return trainer


def attach(trainer, group):
    trainer.actor_rollout_wg = trainer.ref_policy_wg = trainer.critic_wg = group
    return group


def tracker(root):
    return int(open(os.path.join(root, "latest_checkpointed_iteration.txt")).read())


@pytest.fixture(autouse=True)
def _file_log(tmp_path, monkeypatch):
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(tmp_path / "log.jsonl"))


def test_saves_every_save_freq_and_at_the_last_step_in_upstreams_layout(tmp_path):
    trainer = trainer_for(tmp_path, steps=5, save_freq=2)
    attach(trainer, CheckpointingGroup([]))
    trainer.fit()
    root = tmp_path / "checkpoints"
    assert sorted(os.listdir(root)) == ["global_step_2", "global_step_4", "global_step_5",
                                        "latest_checkpointed_iteration.txt"]
    assert tracker(root) == 5
    assert sorted(os.listdir(root / "global_step_4")) == ["actor", "checkpoint_manifest.json", "critic", "data.pt"]
    state = torch.load(root / "global_step_5" / "data.pt", weights_only=True)  # plain values only
    # 12 prompts / batch 4 = 3 batches per epoch: step 5 is the second batch of the second epoch
    assert (state["epoch"], state["batches_done"], state["sampler_seed"]) == (1, 2, 7)


def test_resumed_run_continues_with_the_next_batch_and_step(tmp_path):
    """3 batches per epoch; the checkpoint at step 4 is inside the second epoch, whose shuffled order
    comes from the sampler's RNG state saved in data.pt (a freshly seeded sampler would repeat epoch 1's)."""
    full = trainer_for(tmp_path / "full", steps=8, save_freq=-1)
    full_group = attach(full, CheckpointingGroup([]))
    full.fit()

    crashed = trainer_for(tmp_path, steps=8, save_freq=2)
    attach(crashed, CheckpointingGroup([], fail_save_at=6))   # dies while saving step 6
    with pytest.raises(OSError, match="disk full"):
        crashed.fit()
    root = tmp_path / "checkpoints"
    assert tracker(root) == 4                                  # the half-saved step 6 is not pointed at

    resumed = trainer_for(tmp_path, steps=8, save_freq=2)
    group = attach(resumed, CheckpointingGroup([]))
    resumed.fit()
    assert group.loaded == [str(root / "global_step_4" / "actor"), str(root / "global_step_4" / "critic")]
    assert group.prompts == full_group.prompts[4:]             # steps 5..8: same batches, same order
    assert full_group.prompts[3] != full_group.prompts[0]      # epochs really are shuffled differently
    assert tracker(root) == 8


def test_nan_stop_leaves_the_last_checkpoint_intact(tmp_path):
    trainer = trainer_for(tmp_path, steps=6, save_freq=1)
    attach(trainer, CheckpointingGroup([], nan_at=3))
    with pytest.raises(TrainingDivergedError):
        trainer.fit()
    root = tmp_path / "checkpoints"
    assert tracker(root) == 2 and not (root / "global_step_3").exists()


def test_retention_keeps_the_newest_checkpoints(tmp_path):
    trainer = trainer_for(tmp_path, steps=5, save_freq=1, **{"trainer.max_actor_ckpt_to_keep": 2,
                                                            "trainer.max_critic_ckpt_to_keep": 1})
    attach(trainer, CheckpointingGroup([]))
    trainer.fit()
    root = tmp_path / "checkpoints"
    assert sorted(p for p in os.listdir(root) if p.startswith("global_step_")) == ["global_step_4", "global_step_5"]
    assert sorted(os.listdir(root / "global_step_4")) == ["actor", "checkpoint_manifest.json", "data.pt"]


def test_resume_modes(tmp_path):
    first = trainer_for(tmp_path, steps=2, save_freq=1)
    attach(first, CheckpointingGroup([]))
    first.fit()
    again = trainer_for(tmp_path, steps=4, save_freq=-1, **{"trainer.resume_mode": "resume_path",
                                                            "trainer.resume_from_path": str(tmp_path / "checkpoints" / "global_step_1")})
    group = attach(again, CheckpointingGroup([]))
    again.fit()
    assert len(group.prompts) == 3                             # steps 2, 3, 4
    fresh = trainer_for(tmp_path, steps=2, save_freq=-1, **{"trainer.resume_mode": "disable"})
    group = attach(fresh, CheckpointingGroup([]))
    fresh.fit()
    assert group.loaded == [] and len(group.prompts) == 2
    bad = trainer_for(tmp_path, steps=2, save_freq=-1, **{"trainer.resume_mode": "resume_path",
                                                          "trainer.resume_from_path": str(tmp_path)})
    attach(bad, CheckpointingGroup([]))
    with pytest.raises(ValueError, match="global_step_"):
        bad.fit()


class _RunsCode:
    """Unpickling this calls os.system: what an edited data.pt could carry."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_data_pt_carrying_code_is_refused_and_not_run(tmp_path):
    first = trainer_for(tmp_path, steps=2, save_freq=2)
    attach(first, CheckpointingGroup([]))
    first.fit()
    data_pt = tmp_path / "checkpoints" / "global_step_2" / "data.pt"
    marker = tmp_path / "payload_ran"
    torch.save({"epoch": 0, "batches_done": 2, "payload": _RunsCode(marker)}, data_pt)
    # without its manifest, as a checkpoint written before manifests (with one, the edit is damage: passed over)
    os.remove(data_pt.parent / "checkpoint_manifest.json")

    resumed = trainer_for(tmp_path, steps=4, save_freq=-1)
    group = attach(resumed, CheckpointingGroup([]))
    with pytest.raises(UnsafeCheckpointError, match=f"refusing to load {data_pt}"):
        resumed.fit()
    assert not marker.exists()                                 # the payload never ran
    assert group.loaded == [] and group.prompts == []          # refused before any weights load or training


def test_a_tracker_naming_a_missing_folder_falls_back_to_the_newest_complete_checkpoint(tmp_path, capsys):
    first = trainer_for(tmp_path, steps=4, save_freq=1)
    attach(first, CheckpointingGroup([]))
    first.fit()
    root = tmp_path / "checkpoints"
    shutil.rmtree(root / "global_step_4")
    os.remove(root / "global_step_3" / "data.pt")             # step 3 is incomplete: not a candidate
    (root / "latest_checkpointed_iteration.txt").write_text("9")

    resumed = trainer_for(tmp_path, steps=4, save_freq=-1)
    group = attach(resumed, CheckpointingGroup([]))
    resumed.fit()
    out = capsys.readouterr().out
    assert "WARNING" in out and "global_step_9" in out and "global_step_2" in out
    assert group.loaded == [str(root / "global_step_2" / "actor"), str(root / "global_step_2" / "critic")]
    assert len(group.prompts) == 2                             # steps 3 and 4; nothing older was overwritten
    assert (root / "global_step_1").is_dir()


@pytest.mark.parametrize("content", ["", "  \n", "step four", "\x00\x01"])
def test_an_empty_or_garbled_tracker_names_the_file(tmp_path, content):
    first = trainer_for(tmp_path, steps=1, save_freq=1)
    attach(first, CheckpointingGroup([]))
    first.fit()
    tracker_file = tmp_path / "checkpoints" / "latest_checkpointed_iteration.txt"
    tracker_file.write_text(content)
    resumed = trainer_for(tmp_path, steps=2, save_freq=-1)
    group = attach(resumed, CheckpointingGroup([]))
    with pytest.raises(CheckpointTrackerError, match=re.escape(str(tracker_file))):
        resumed.fit()
    assert group.prompts == []


def test_steps_beyond_the_epochs_end_at_the_real_last_step_with_save_and_validation(tmp_path, capsys):
    """12 prompts / batch 4 x 2 epochs = 6 steps, though 50 were asked for: say so, save and validate at 6."""
    trainer = trainer_for(tmp_path, steps=50, save_freq=4, **{"trainer.total_epochs": 2, "trainer.test_freq": 100})
    group = attach(trainer, CheckpointingGroup([]))
    validated = []
    real_validate = trainer._validate
    trainer._validate = lambda: validated.append(trainer.global_steps) or real_validate()
    out = capsys.readouterr().out
    assert "total_training_steps=50" in out and "training runs 6 steps" in out
    assert trainer.total_training_steps == 6
    trainer.fit()
    root = tmp_path / "checkpoints"
    assert tracker(root) == 6 and (root / "global_step_4").is_dir()
    assert validated == [6] and len(group.prompts) == 6
