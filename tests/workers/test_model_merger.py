"""`python -m verl.model_merger merge --backend fsdp ...` turns this verl's checkpoints into Hugging Face
folders: two gloo ranks train and save an actor and a critic, the stock command merges each role folder,
and `from_pretrained` on the result reproduces the live sharded model's outputs.
"""
import json
import os
import subprocess
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from worker_setup import REPO, run_ranks, tiny_model  # noqa: E402

from verl.model_merger.__main__ import main as merger_main  # noqa: E402
from verl.model_merger.fsdp_model_merger import merge_state_dicts  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    model_dir = tiny_model(str(tmp_path_factory.mktemp("merge_model")))
    ckpt = tmp_path_factory.mktemp("merge_ckpt")
    run_ranks(lambda rank: [os.path.join(HERE, "merge_runner.py"), model_dir, str(ckpt)], world=2)
    return ckpt


def _merge(*args):
    proc = subprocess.run([sys.executable, "-m", "verl.model_merger", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120, check=False,
                          env=dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")])))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


@pytest.mark.parametrize("role, auto_class", [("actor", "AutoModelForCausalLM"),
                                              ("critic", "AutoModelForTokenClassification")])
def test_merged_folder_reproduces_the_checkpointed_model(checkpoint, tmp_path, role, auto_class):
    import transformers

    local_dir = checkpoint / "global_step_1" / role
    assert json.loads((local_dir / "fsdp_config.json").read_text()) == {"FSDP_version": 2, "world_size": 2}
    target = tmp_path / "merged"
    _merge("merge", "--backend", "fsdp", "--local_dir", str(local_dir), "--target_dir", str(target))
    assert (target / "tokenizer_config.json").is_file() and (target / "model.safetensors").is_file()
    model = getattr(transformers, auto_class).from_pretrained(str(target))
    probe = torch.load(checkpoint / "probe.pt")
    with torch.no_grad():
        out = model(input_ids=probe["ids"]).logits
    assert model.dtype == torch.float32
    # same weights, same float32 math on one process: equal up to summation order
    torch.testing.assert_close(out, probe[role], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(out, torch.zeros_like(out))
    # the `test` operation (run in-process: a second interpreter start costs CI time) agrees with the folder
    assert merger_main(["test", "--backend", "fsdp", "--local_dir", str(local_dir), "--test_hf_dir", str(target)]) == 0


def test_shards_join_along_dim0_and_whole_tensors_come_from_rank0():
    """FSDP2's uneven split (5 rows over 2 ranks: 3 + 2) joins back; replicated tensors are kept once."""
    full = torch.arange(10.0).reshape(5, 2)
    shards = [{"w": full[:3], "b": torch.ones(4)}, {"w": full[3:], "b": torch.ones(4)}]
    merged = merge_state_dicts(shards, {"w": torch.Size([5, 2]), "b": torch.Size([4])})
    assert torch.equal(merged["w"], full) and torch.equal(merged["b"], torch.ones(4))
    with pytest.raises(ValueError, match="join to"):
        merge_state_dicts(shards, {"w": torch.Size([6, 2]), "b": torch.Size([4])})
    with pytest.raises(KeyError, match="lacks"):
        merge_state_dicts(shards, {"w": torch.Size([5, 2])})


def test_other_backends_are_refused_with_a_clear_message(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "verl.model_merger", "merge", "--backend", "megatron",
                           "--local_dir", str(tmp_path), "--target_dir", str(tmp_path / "out")], cwd=REPO,
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2 and "use --backend fsdp" in proc.stderr
