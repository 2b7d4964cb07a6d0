"""`VERL_STARTUP_TRICKS=0` turns every start-up trick off, and a real start (the config check, the
tokenizer, the tiny model built from the plan's role settings, one forward) gives the same tokens and
the same logits with the tricks on and off."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from verl.utils.startup import SWITCH, tricks_enabled
from verl.utils.tiny_model import build_tiny_model_dir

REPO_ROOT = Path(__file__).resolve().parents[2]

# One fresh process per setting: the tricks act while transformers is first imported.
CHILD = r"""
import json, os, sys
import torch
from verl.utils.startup.bytecode_cache import configure
choice = configure()
from verl.trainer.config_check import check_overrides
from verl.compat.plan import RolePlan
from verl.workers.model_building.loading import build_model, load_tokenizer

model_dir, out = sys.argv[1], sys.argv[2]
check_overrides([f"actor_rollout_ref.model.path={model_dir}"])
role = RolePlan(param_dtype="float32", compute_dtype="float32", grad_scaler=False, attn_implementation="sdpa",
                use_remove_padding=False, gradient_checkpointing=False, param_offload=False,
                optimizer_offload=False, micro_batch_size_per_gpu=1, max_token_len_per_gpu=64)
tokenizer = load_tokenizer(model_dir)
ids = tokenizer("two plus two is four", return_tensors="pt").input_ids
with torch.no_grad():
    logits = build_model(model_dir, role, train=False)(ids).logits
torch.save(logits, out)
index = os.path.join(os.environ["XDG_CACHE_HOME"], "verl", "import_structure")
print(json.dumps({"bytecode": choice.reason, "ids": ids.tolist(),
                  "index_files": len(os.listdir(index)) if os.path.isdir(index) else 0}))
"""


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_tiny_model_dir(str(tmp_path_factory.mktemp("tiny")), hidden_size=32, num_layers=2,
                                intermediate_size=64, num_heads=4, num_kv_heads=2, seed=0)


def _start(model_dir, tmp_path, setting):
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / f"cache_{setting}"), PYTHONDONTWRITEBYTECODE="1",
               PYTHONPATH=os.pathsep.join(p for p in [str(REPO_ROOT), os.environ.get("PYTHONPATH")] if p))
    env[SWITCH] = setting
    env.pop("VERL_PYCACHE", None)
    out = tmp_path / f"logits_{setting}.pt"
    done = subprocess.run([sys.executable, "-c", CHILD, model_dir, str(out)], env=env, capture_output=True,
                          text=True, timeout=50)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), torch.load(out)


def test_the_switch_reads_the_environment(monkeypatch):
    monkeypatch.delenv(SWITCH, raising=False)
    assert tricks_enabled()
    for off in ("0", "off", "False", " no "):
        monkeypatch.setenv(SWITCH, off)
        assert not tricks_enabled()
    monkeypatch.setenv(SWITCH, "1")
    assert tricks_enabled()


def test_a_real_start_with_the_tricks_off_and_on(model_dir, tmp_path):
    off, off_logits = _start(model_dir, tmp_path, "0")
    on, on_logits = _start(model_dir, tmp_path, "1")
    # off: the bytecode cache says why it stayed out and no models index is written
    assert off["bytecode"].startswith(f"{SWITCH}=0") and off["index_files"] == 0
    # on: transformers' models index was kept on disk on the way in
    assert not on["bytecode"].startswith(SWITCH) and on["index_files"] >= 1
    assert off["ids"] == on["ids"]
    assert off_logits.shape[:2] == (1, len(on["ids"][0])) and torch.equal(off_logits, on_logits)
