"""Hub ids and remote paths resolve wherever a model path is read (verl.utils.fs.resolve_model_path).

The cache is a temporary HF_HOME with a tiny model saved under `Qwen/Qwen2.5-0.5B-Instruct`, and
HF_HUB_OFFLINE=1: the real huggingface_hub lookup runs, nothing is downloaded.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hub_cache import add_to_hub_cache, offline_env

from verl.utils import fs
from verl.utils.tiny_model import build_tiny_model_dir

REPO_ID = "Qwen/Qwen2.5-0.5B-Instruct"
REPO_ROOT = Path(__file__).resolve().parents[2]


# the README quick-start's batch keys, CPU-sized
PLANNABLE = ["data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
             "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "critic.ppo_micro_batch_size_per_gpu=2",
             "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
             "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4", "critic.optim.lr=1e-5",
             "trainer.n_gpus_per_node=1", "trainer.nnodes=1"]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return build_tiny_model_dir(str(tmp_path_factory.mktemp("tiny")))


@pytest.fixture
def offline_cache(tiny_dir, tmp_path, monkeypatch):
    """A populated cache, made the process's own (huggingface_hub reads its constants at import)."""
    from huggingface_hub import constants

    snapshot = add_to_hub_cache(tiny_dir, tmp_path / "hf", REPO_ID)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return snapshot


def test_local_paths_are_returned_unchanged(tiny_dir):
    assert fs.resolve_model_path(tiny_dir) == tiny_dir
    assert fs.resolve_model_path(tiny_dir, "config.json") == os.path.join(tiny_dir, "config.json")
    assert fs.copy_to_local(tiny_dir) == tiny_dir


def test_hub_id_resolves_from_the_cache_offline(offline_cache):
    assert fs.resolve_model_path(REPO_ID) == str(offline_cache)
    assert fs.resolve_model_path(REPO_ID, "config.json") == str(offline_cache / "config.json")


def test_uncached_hub_id_offline_is_a_clear_error(offline_cache):
    with pytest.raises(FileNotFoundError, match="HF_HUB_OFFLINE is set.*huggingface-cli download Qwen/absent"):
        fs.resolve_model_path("Qwen/absent")


def test_a_missing_local_path_is_not_taken_for_a_hub_id():
    with pytest.raises(FileNotFoundError, match="neither a local file/folder nor a Hugging Face hub id"):
        fs.resolve_model_path("/no/such/model")


def test_model_spec_tokenizer_and_weights_load_from_a_hub_id(offline_cache, tiny_dir):
    from verl.compat import build_plan
    from verl.compat.planning.model_spec import ModelSpec
    from verl.trainer.config_check import load_config
    from verl.workers.model_building.loading import build_model, load_tokenizer

    assert ModelSpec.from_pretrained(REPO_ID) == ModelSpec.from_pretrained(tiny_dir)
    assert load_tokenizer(REPO_ID)("1 + 2").input_ids == load_tokenizer(tiny_dir)("1 + 2").input_ids
    config = load_config([f"actor_rollout_ref.model.path={REPO_ID}", f"critic.model.path={REPO_ID}",
                          *PLANNABLE], check=False)
    role = build_plan(config).actor
    ids = torch.tensor([[1, 2, 3, 4]])
    hub = build_model(REPO_ID, role, train=False)(ids).logits
    local = build_model(tiny_dir, role, train=False)(ids).logits
    torch.testing.assert_close(hub, local, rtol=0, atol=0)
    critic = build_model(REPO_ID, role, value_head=True, train=False)
    assert critic.config.num_labels == 1


def test_use_shm_copies_a_hub_model_into_shared_memory(offline_cache, tmp_path, monkeypatch):
    monkeypatch.setattr(fs, "SHM_CACHE_DIR", str(tmp_path / "shm"))
    local = fs.copy_to_local(REPO_ID, use_shm=True)
    assert local.startswith(str(tmp_path / "shm")) and sorted(os.listdir(local)) == sorted(os.listdir(offline_cache))
    assert fs.copy_to_local(REPO_ID, use_shm=True) == local      # copied once


def test_hdfs_path_without_a_client_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(fs.shutil, "which", lambda name: None)
    with pytest.raises(FileNotFoundError, match="no `hdfs` command is on PATH"):
        fs.copy_to_local("hdfs://cluster/models/qwen", cache_dir=str(tmp_path))


def test_hdfs_path_is_copied_once_into_the_cache(tmp_path, monkeypatch, tiny_dir):
    """A stand-in `hdfs` client (a script that copies a local folder) shows the copy-once contract."""
    calls = tmp_path / "calls.txt"
    client = tmp_path / "bin" / "hdfs"
    client.parent.mkdir()
    client.write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\ncp -r {tiny_dir} \"$4\"\n")
    client.chmod(0o755)
    monkeypatch.setenv("PATH", f"{client.parent}:{os.environ['PATH']}")
    cache = tmp_path / "cache"
    first = fs.copy_to_local("hdfs://cluster/models/qwen", cache_dir=str(cache))
    again = fs.copy_to_local("hdfs://cluster/models/qwen", cache_dir=str(cache))
    assert first == again and first.endswith("/qwen") and first.startswith(str(cache))
    assert calls.read_text().splitlines() == [f"dfs -get hdfs://cluster/models/qwen {first}.partial"]
    assert sorted(os.listdir(first)) == sorted(os.listdir(tiny_dir))


def test_doctor_plans_the_readme_quickstart_model_from_the_cache(tiny_dir, tmp_path):
    """`python -m verl.compat` with the README's model ids, as a user with a populated cache runs it."""
    add_to_hub_cache(tiny_dir, tmp_path / "hf", REPO_ID)
    args = [sys.executable, "-m", "verl.compat", "--json", f"actor_rollout_ref.model.path={REPO_ID}",
            f"critic.model.path={REPO_ID}", *PLANNABLE]
    proc = subprocess.run(args, cwd=REPO_ROOT, env=offline_env(tmp_path / "hf"), capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # sized from the cached tiny model's config.json (the real 0.5B model plans ~18 GiB here; the tiny one's
    # peak is its validation phase: one full generation chunk)
    assert 0 < json.loads(proc.stdout)["predicted_peak_gb"] < 3

    empty = subprocess.run(args, cwd=REPO_ROOT, env=offline_env(tmp_path / "empty"), capture_output=True, text=True,
                           timeout=120, check=False)
    assert empty.returncode == 2 and empty.stdout == ""
    assert "not in the Hugging Face cache" in empty.stderr and "HF_HUB_OFFLINE is set" in empty.stderr
