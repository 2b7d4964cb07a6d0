"""A damaged newest checkpoint and a full disk, against the real trainer with scripted worker groups
(no Ray, no models): a truncated shard or data.pt is passed over for the newest sound checkpoint, with a
warning naming the file; a save that finds (or meets) a full disk says which folder, how much it needed and
how much was free, and leaves no part of its step behind.
"""
import errno
import os
import shutil
from collections import namedtuple

import pytest
import torch
from test_trainer_checkpoint import CheckpointingGroup, attach, tracker, trainer_for

import verl.utils.checkpoint.checkpoint_manager as checkpoint_manager


@pytest.fixture(autouse=True)
def _file_log(tmp_path, monkeypatch):
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(tmp_path / "log.jsonl"))


class ShardWritingGroup(CheckpointingGroup):
    """Writes a real torch file as its shard (1 MiB), so truncation and sizes mean something."""

    def save_checkpoint(self, local_path, hdfs_path=None, global_step=0, max_ckpt_to_keep=None):
        os.makedirs(local_path, exist_ok=True)
        torch.save({"w": torch.full((256, 1024), float(global_step))},
                   os.path.join(local_path, "model_world_size_1_rank_0.pt"))


def _train(tmp_path, steps=4, group=None):
    trainer = trainer_for(tmp_path, steps=steps, save_freq=2)
    attach(trainer, group or ShardWritingGroup([]))
    trainer.fit()
    return tmp_path / "checkpoints"


def _truncate(path, keep=100):
    with open(path, "r+b") as f:
        f.truncate(keep)


def _resume(tmp_path, steps=6, **overrides):
    trainer = trainer_for(tmp_path, steps=steps, save_freq=2, **overrides)
    group = attach(trainer, ShardWritingGroup([]))
    trainer.fit()
    return group


@pytest.mark.parametrize("bad", ["global_step_4/actor/model_world_size_1_rank_0.pt", "global_step_4/data.pt"])
def test_a_truncated_newest_checkpoint_is_passed_over_for_the_newest_sound_one(tmp_path, capsys, bad):
    root = _train(tmp_path)
    assert tracker(root) == 4
    _truncate(root / bad)
    group = _resume(tmp_path)
    assert group.loaded[0] == str(root / "global_step_2" / "actor")
    out = capsys.readouterr().out
    assert str(root / bad) in out and "global_step_2" in out   # the warning names the bad file and the fallback
    assert tracker(root) == 6


def test_a_damaged_checkpoint_named_by_resume_from_path_stops_naming_the_file(tmp_path):
    root = _train(tmp_path)
    _truncate(root / "global_step_4" / "actor" / "model_world_size_1_rank_0.pt")
    with pytest.raises(ValueError, match=r"damaged checkpoint file .*global_step_4/actor/model_world_size_1_rank_0\.pt"):
        _resume(tmp_path, **{"trainer.resume_mode": "resume_path",
                             "trainer.resume_from_path": str(root / "global_step_4")})


class AdapterWritingGroup(ShardWritingGroup):
    """Also writes an adapter folder inside the component, as a LoRA save would."""

    def save_checkpoint(self, local_path, hdfs_path=None, global_step=0, max_ckpt_to_keep=None):
        super().save_checkpoint(local_path, hdfs_path, global_step, max_ckpt_to_keep)
        os.makedirs(os.path.join(local_path, "lora_adapter"), exist_ok=True)
        with open(os.path.join(local_path, "lora_adapter", "adapter_config.json"), "w") as f:
            f.write('{"r": 8}')


def test_the_manifest_covers_every_file_of_the_step_and_a_pruned_component_is_not_damage(tmp_path, capsys):
    import json

    from verl.utils.checkpoint.manifest import MANIFEST_FILE, verify

    root = _train(tmp_path, group=AdapterWritingGroup([]))
    files = json.load(open(root / "global_step_4" / MANIFEST_FILE))["files"]
    assert sorted(files) == [f"{c}/{f}" for c in ("actor", "critic")
                             for f in ("lora_adapter/adapter_config.json", "model_world_size_1_rank_0.pt")] + ["data.pt"]
    adapter = root / "global_step_4" / "actor" / "lora_adapter" / "adapter_config.json"
    adapter.write_text('{"r": 9}')                                         # same size, other bytes
    group = _resume(tmp_path)
    assert group.loaded[0] == str(root / "global_step_2" / "actor")
    assert f"{adapter}: its CRC-32 is" in capsys.readouterr().out
    verify(str(root / "global_step_4"))                                    # saved again by the resumed run
    shutil.rmtree(root / "global_step_2" / "critic")                       # retention's doing: not damage
    verify(str(root / "global_step_2"))


Usage = namedtuple("Usage", "total used free")


def test_a_save_that_cannot_fit_stops_before_writing_and_says_how_much(tmp_path, monkeypatch):
    root = _train(tmp_path, steps=2)                      # step 2 is on disk: the next step needs about as much
    monkeypatch.setattr(shutil, "disk_usage", lambda path: Usage(10 << 30, 10 << 30, 4096))
    with pytest.raises(OSError, match=r"global_step_4.*needs about 2\.\d\d MiB, and 4\.00 KiB are free"):
        _resume(tmp_path, steps=4)
    assert tracker(root) == 2
    assert sorted(os.listdir(root)) == ["global_step_2", "latest_checkpointed_iteration.txt"]


def test_a_disk_that_fills_during_a_save_leaves_nothing_of_the_step(tmp_path, monkeypatch):
    root = _train(tmp_path, steps=2)
    real_save = torch.save

    def full_disk(obj, path, *args, **kwargs):
        if str(path).endswith("data.pt.partial"):
            with open(path, "wb") as f:
                f.write(b"x" * 1000)                       # part of it reached the disk
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(checkpoint_manager.torch, "save", full_disk)
    with pytest.raises(OSError, match=r"ran out of disk space while saving the checkpoint .*global_step_4: it needs "
                                      r"about 2\.\d\d MiB, and .* are free on that disk now"):
        _resume(tmp_path, steps=4)
    assert tracker(root) == 2
    assert sorted(os.listdir(root)) == ["global_step_2", "latest_checkpointed_iteration.txt"]


def test_an_edited_data_pt_fails_its_manifest_and_nothing_in_it_runs(tmp_path, capsys):
    from test_trainer_checkpoint import _RunsCode

    root = _train(tmp_path)
    marker = tmp_path / "payload_ran"
    torch.save({"epoch": 0, "batches_done": 2, "payload": _RunsCode(marker)}, root / "global_step_4" / "data.pt")
    group = _resume(tmp_path)
    assert group.loaded[0] == str(root / "global_step_2" / "actor")
    assert "global_step_4/data.pt" in capsys.readouterr().out
    assert not marker.exists()
