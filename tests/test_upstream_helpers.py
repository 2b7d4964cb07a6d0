"""Public helpers upstream recipes and custom code import: verl.utils.device, verl.utils.metric,
verl.base_config / verl.trainer.config / verl.utils.config, main_ppo's data factories with a custom
sampler, seqlen_balancing's partitions and dynamic batches, DataProto <-> TensorDict."""
import textwrap
from dataclasses import FrozenInstanceError

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from verl.protocol import DataProto


# ------------------------------------------------------------------------------- verl.utils.device

def test_device_helpers_follow_the_applied_plan_and_the_planner_rule(tmp_path):
    from verl.compat import build_plan
    from verl.compat.apply import apply_plan as apply
    from verl.compat.device.catalog import get_profile
    from verl.compat.device.detect import detect_software
    from verl.compat.apply.device_names import names_for_backend
    from verl.compat.planning.planner import make_plan
    from verl.trainer.config_check import load_config
    from verl.utils import device
    from verl.utils.tiny_model import build_tiny_model_dir

    model = build_tiny_model_dir(str(tmp_path / "m"))
    config = load_config([f"actor_rollout_ref.model.path={model}", "data.train_batch_size=4",
                          "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                          "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
                          "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
                          "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=2",
                          "critic.ppo_micro_batch_size_per_gpu=2", "trainer.n_gpus_per_node=1"], check=False)
    # the names the helpers use for a device backend are the planner's, for every catalog backend
    for name in ("t4", "a100-80gb", "mi300x", "cpu"):
        profile = get_profile(name)
        plan = make_plan(profile, config, detect_software(profile))
        assert names_for_backend(profile.backend) == (plan.device_type, plan.dist_backend), name
    # in a worker the helpers answer from the plan in force
    plan = build_plan(config)
    apply.apply_in_process(plan, 0)
    assert device.get_device_name() == plan.device_type == "cpu"
    assert device.get_nccl_backend() == plan.dist_backend == "gloo"
    assert device.get_torch_device() is torch.cpu and device.get_device_id() == 0
    assert device.is_cuda_available is False and device.is_npu_available is False


# ------------------------------------------------------------------------------- verl.utils.metric

def test_reduce_metrics_uses_max_and_min_by_name():
    from verl.utils.metric import reduce_metrics

    out = reduce_metrics({"loss": [1.0, 2.0, 3.0], "max_reward": [5.0, 8.0, 6.0], "min_error": [0.1, 0.05, 0.2],
                          "perf/max_memory_allocated_gb": torch.tensor([1.0, 4.0])})
    assert out == {"loss": 2.0, "max_reward": 8.0, "min_error": 0.05, "perf/max_memory_allocated_gb": 4.0}


# ------------------------------------------------------------------------------- config dataclasses

def test_algo_config_from_the_composed_config():
    from verl.base_config import BaseConfig
    from verl.trainer.config import AlgoConfig, KLControlConfig
    from verl.trainer.config_check import load_config
    from verl.utils.config import omega_conf_to_dataclass

    cfg = load_config(["algorithm.adv_estimator=grpo", "algorithm.kl_ctrl.kl_coef=0.01"], check=False)
    algo = omega_conf_to_dataclass(cfg.algorithm, AlgoConfig)
    assert isinstance(algo, BaseConfig) and isinstance(algo.kl_ctrl, KLControlConfig)
    assert algo.adv_estimator == "grpo" and algo["kl_ctrl"]["kl_coef"] == 0.01 and algo.get("missing", 7) == 7
    assert algo.filter_groups["enable"] is False and "gamma" in list(algo) and len(algo) == 14
    with pytest.raises(FrozenInstanceError):
        algo.gamma = 0.5
    assert omega_conf_to_dataclass({}, KLControlConfig) == KLControlConfig()
    built = omega_conf_to_dataclass(OmegaConf.create({"_target_": "verl.trainer.config.KLControlConfig",
                                                      "type": "adaptive"}))
    assert isinstance(built, KLControlConfig) and built.type == "adaptive"
    with pytest.raises(ValueError, match="_target_"):
        omega_conf_to_dataclass({"type": "fixed"})
    with pytest.raises(Exception):   # OmegaConf refuses keys the dataclass lacks
        omega_conf_to_dataclass({"not_a_field": 1}, KLControlConfig)
    # a custom estimator's config works with the registry's `config` argument
    from verl.trainer.ppo import core_algos

    scores = torch.tensor([[0.0, 1.0], [0.0, 0.0]])
    adv, _ = core_algos.get_adv_estimator_fn("grpo_passk")(token_level_rewards=scores, response_mask=torch.ones(2, 2),
                                                           index=np.array([0, 0]), config=algo)
    assert adv[0, 0] > 0 and adv[1].abs().sum() == 0


# ------------------------------------------------------------------------------- data factories

def test_main_ppo_data_factories_and_a_custom_sampler(tmp_path):
    import verl.trainer.main_ppo as main_ppo
    from verl.utils.dataset import rl_dataset

    assert main_ppo.create_rl_dataset is rl_dataset.create_rl_dataset
    (tmp_path / "my_sampler.py").write_text(textwrap.dedent("""
        import torch

        class EvenFirst(torch.utils.data.Sampler):
            def __init__(self, data_source, data_config):
                self.n, self.step = len(data_source), data_config.sampler_step
            def __iter__(self):
                return iter(list(range(0, self.n, self.step)) + [i for i in range(self.n) if i % self.step])
            def __len__(self):
                return self.n
    """))
    config = OmegaConf.create({"shuffle": True, "seed": 1, "sampler_step": 2,
                               "sampler": {"class_path": str(tmp_path / "my_sampler.py"), "class_name": "EvenFirst"}})
    sampler = main_ppo.create_rl_sampler(config, list(range(5)))
    assert list(sampler) == [0, 2, 4, 1, 3]
    config.sampler = {"class_path": None, "class_name": None}
    assert sorted(main_ppo.create_rl_sampler(config, list(range(5)))) == [0, 1, 2, 3, 4]
    config.sampler = {"class_path": str(tmp_path / "my_sampler.py"), "class_name": "torch"}
    with pytest.raises(TypeError, match="not a torch.utils.data.Sampler"):
        main_ppo.create_rl_sampler(config, list(range(5)))


# ------------------------------------------------------------------------------- seqlen_balancing

@pytest.mark.parametrize("equal_size", [True, False])
def test_seqlen_balanced_partitions(equal_size):
    from verl.utils.seqlen_balancing import get_seqlen_balanced_partitions

    lengths = [50, 3, 17, 8, 41, 22, 9, 30]
    parts = get_seqlen_balanced_partitions(lengths, 4, equal_size=equal_size)
    assert sorted(i for p in parts for i in p) == list(range(8)) and all(p == sorted(p) and p for p in parts)
    if equal_size:
        assert [len(p) for p in parts] == [2, 2, 2, 2]
    sums = [sum(lengths[i] for i in p) for p in parts]
    assert max(sums) - min(sums) <= max(lengths)
    with pytest.raises(ValueError, match="split evenly"):
        get_seqlen_balanced_partitions(lengths, 3, equal_size=True)


def test_prepare_dynamic_batch_keeps_rows_with_their_columns():
    from verl.utils.seqlen_balancing import prepare_dynamic_batch, restore_dynamic_batch

    lengths = [6, 2, 5, 1, 4, 3]
    mask = torch.zeros(6, 6, dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, :n] = 1
    data = DataProto.from_dict({"attention_mask": mask, "row": torch.arange(6)},
                               {"tag": np.array([f"r{i}" for i in range(6)], dtype=object)}, meta_info={"t": 1.0})
    batches, parts = prepare_dynamic_batch(data, max_token_len=8)
    assert all(int(b.batch["attention_mask"].sum()) <= 8 for b in batches)
    for b, idx in zip(batches, parts):
        assert b.batch["row"].tolist() == idx and list(b.non_tensor_batch["tag"]) == [f"r{i}" for i in idx]
        assert b.meta_info == {"t": 1.0}
    rows = restore_dynamic_batch(torch.cat([b.batch["row"] for b in batches]), parts)
    assert rows.tolist() == list(range(6))
    even, _ = prepare_dynamic_batch(data, max_token_len=8, num_batches_divided_by=4)
    assert len(even) % 4 == 0 and len(even) >= len(batches)


# ------------------------------------------------------------------------------- tensordict

def test_dataproto_tensordict_round_trip():
    pytest.importorskip("tensordict", reason="tensordict is optional (it would raise the torch floor)")
    data = DataProto.from_dict({"ids": torch.arange(6).view(3, 2)},
                               {"uid": np.array(["a", {"k": 1}, None], dtype=object)}, meta_info={"temperature": 0.7})
    td = data.to_tensordict()
    assert td.batch_size == torch.Size([3]) and torch.equal(td["ids"], data.batch["ids"])
    back = DataProto.from_tensordict(td)
    assert torch.equal(back.batch["ids"], data.batch["ids"])
    assert list(back.non_tensor_batch["uid"]) == ["a", {"k": 1}, None] and back.meta_info == {"temperature": 0.7}
