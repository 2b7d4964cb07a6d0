"""Upstream's import paths that must keep working, and `import verl` / `verl.utils` staying light."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def run_python(code: str) -> list[str]:
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         env=dict(os.environ, PYTHONPATH=path), timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_import_verl_and_verl_utils_load_neither_torch_nor_transformers():
    heavy = "[m for m in ('torch', 'transformers', 'ray') if m in sys.modules]"
    assert run_python(f"import sys, verl, verl.utils; print(len({heavy}))") == ["0"]


def test_from_verl_import_dataproto_is_the_protocol_class():
    assert run_python("from verl import DataProto; import verl.protocol as p; print(DataProto is p.DataProto)") \
        == ["True"]


def test_unknown_attribute_and_submodules():
    import verl

    with pytest.raises(AttributeError, match="no attribute 'NoSuchThing'"):
        verl.NoSuchThing  # noqa: B018
    # submodules still import through `from verl import ...`
    from verl import compat, protocol

    assert compat.torch_dtype("fp16") is not None and protocol.DataProto is verl.DataProto


def test_upstream_trainer_paths_lead_to_one_definition_each():
    """verl.trainer.ppo.utils and ray_trainer re-export; nothing is defined twice."""
    from verl.single_controller import ray as sc_ray
    from verl.trainer import config_check
    from verl.trainer.ppo import ray_trainer, utils
    from verl.utils.dataset import rl_dataset

    assert utils.create_rl_dataset is rl_dataset.create_rl_dataset
    assert utils.create_rl_sampler is rl_dataset.create_rl_sampler
    assert utils.need_critic is config_check.need_critic
    assert utils.need_reference_policy is config_check.need_reference_policy
    assert ray_trainer.Role is utils.Role and str(utils.Role.ActorRolloutRef) == "actor_rollout_ref"
    assert ray_trainer.ResourcePoolManager is sc_ray.ResourcePoolManager
