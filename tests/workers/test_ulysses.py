"""Ulysses sequence parallelism (`ulysses_sequence_parallel_size`) on 2 gloo ranks against size 1.

With sp=2 on 2 ranks (data-parallel size 1) each rank runs half of every micro-batch's sequence and
attention exchanges heads for sequence (all-to-all: gloo has it in torch 2.13). Actor log-probs and
entropies, reference log-probs, critic values and the gradients of one actor and one critic update
equal one rank's without sequence parallelism, for padded and packed (use_remove_padding) micro-batches,
with SDPA, eager (one key/value head: repeated to 2 before the exchange) and torch_varlen (its CPU
reference kernel), with token-budgeted micro-batches (a group spends sp x the per-device budget) and with
gradient checkpointing (the recomputation inside backward runs split too). Tolerance: float32, 1e-5 relative / 1e-6 absolute (only the order of the
reductions inside attention and the gradient sum changes).
"""
import os
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from worker_setup import run_ranks, tiny_model  # noqa: E402

VARIANTS = [("kv2", "sdpa-padded"), ("kv2", "sdpa-packed"), ("kv1", "eager-padded"), ("kv2", "torch_varlen-packed"),
            ("kv2", "sdpa-packed-budget"), ("kv2", "sdpa-padded-budget"), ("kv2", "sdpa-padded-checkpointed"),
            ("kv1", "eager-packed-checkpointed")]
TOL = dict(rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory):
    from verl.utils.tiny_model import build_tiny_model_dir

    kv1 = build_tiny_model_dir(str(tmp_path_factory.mktemp("tiny_kv1")), hidden_size=32, num_layers=2,
                               intermediate_size=64, num_heads=4, num_kv_heads=1, seed=0)
    return {"kv2": tiny_model(str(tmp_path_factory.mktemp("tiny_kv2"))), "kv1": kv1}


@pytest.fixture(scope="module")
def pair(model_dirs, tmp_path_factory):
    """Both ranks' results for every variant, from one launch of 2 processes (sp=2)."""
    out = tmp_path_factory.mktemp("ulysses")
    jobs = [f"{model_dirs[m]}:{v}" for m, v in VARIANTS]
    paths = [out / f"rank{rank}.pt" for rank in range(2)]
    run_ranks(lambda rank: [os.path.join(HERE, "ulysses_runner.py"), str(paths[rank]), "2", *jobs], 2)
    return [torch.load(p) for p in paths]


@pytest.mark.parametrize("model,variant", VARIANTS)
def test_sequence_parallel_size_two_equals_size_one(model_dirs, pair, model, variant):
    from ulysses_runner import run

    key = f"{model_dirs[model]}:{variant}"
    single = run([(model_dirs[model], variant)], sp=1)[key]
    ranks = [p[key] for p in pair]
    # attention ran split in every phase: 4 exchanges (q, k, v, out) per layer and forward, backward
    # exchanges on top in the updates; none at size 1
    phases = ("log_probs", "update_actor", "ref_log_prob", "values", "update_critic")
    for rank in ranks:
        assert all(rank["exchanges"].get(phase, 0) >= 8 for phase in phases), rank["exchanges"]
        assert rank["exchanges"]["update_actor"] > rank["exchanges"]["log_probs"]
    assert single["exchanges"] == {}
    for name in ("log_probs", "entropys", "ref_log_prob", "values"):
        # each rank returns the rows it was handed, so the collected output is the concatenation
        torch.testing.assert_close(torch.cat([r[name] for r in ranks]), single[name], **TOL, msg=name)
    assert single["entropys"].abs().sum() > 0 and single["values"].abs().sum() > 0
    for role in ("actor", "critic"):
        for rank in ranks:
            assert len(rank[f"{role}_grads"]) == len(single[f"{role}_grads"])
            for got, want in zip(rank[f"{role}_grads"], single[f"{role}_grads"]):
                torch.testing.assert_close(got, want, **TOL, msg=role)
        assert any(g.abs().sum() > 0 for g in single[f"{role}_grads"])
    for name, value in {**single["actor_metrics"], **single["critic_metrics"]}.items():
        # both ranks of the group hold the same rows and report the whole group's loss
        mean = [sum(r[f"{name.split('/')[0]}_metrics"][name][i] for r in ranks) / 2 for i in range(len(value))]
        assert mean == pytest.approx(value, rel=1e-5), name


# ------------------------------------------------------------------------------ plan and config checks


def _qwen05_plan(sp: int, gpus: int = 2, heads_ok: bool = True, **extra):
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "compat"))
    from test_planner import PLAIN, QWEN05, config

    from verl.compat.device.catalog import get_profile
    from verl.compat.planning.planner import make_plan

    cfg = config(64, 1024, 1024, 16, 2, 4, trainer__n_gpus_per_node=gpus, actor_rollout_ref__actor__use_kl_loss=True,
                 actor_rollout_ref__actor__ulysses_sequence_parallel_size=sp, critic__ulysses_sequence_parallel_size=sp,
                 **extra)
    return make_plan(get_profile("h200"), cfg, PLAIN, QWEN05)


def test_plan_carries_the_size_and_divides_activations_per_device():
    """The planner's role plans carry sp (the reference's follows the actor's, as upstream), its reasons
    name Ulysses, and the memory model's activations (and LM-head / value rows) per device are 1/sp."""
    one, two = _qwen05_plan(1), _qwen05_plan(2)
    assert [r.sequence_parallel_size for r in (two.actor, two.ref, two.critic)] == [2, 2, 2]
    assert [r.sequence_parallel_size for r in (one.actor, one.ref, one.critic)] == [1, 1, 1]
    assert any("Ulysses" in why and "activations per device / 2" in why for why in two.reasons.values())
    assert two.actor.micro_batch_size_per_gpu == one.actor.micro_batch_size_per_gpu
    compared = 0
    for phase, terms in one.memory["phases"].items():
        for name, gb in terms.items():
            if name.startswith("activations") or name == "values":
                assert two.memory["phases"][phase][name] == pytest.approx(gb / 2, rel=1e-3, abs=1e-4), (phase, name)   # GiB, 4 decimals
                compared += 1
    assert compared >= 3


def test_plan_refuses_a_size_that_divides_neither_ranks_nor_heads():
    from verl.compat.planning.planner import PlanError

    with pytest.raises(PlanError, match=r"actor_rollout_ref.actor.ulysses_sequence_parallel_size=3 must be a "
                                        r"positive divisor of the ranks .* = 2"):
        _qwen05_plan(3)
    # Qwen2.5-0.5B has 14 attention heads: 4 ranks cannot share them evenly
    with pytest.raises(PlanError, match=r"ulysses_sequence_parallel_size=4 must divide the model's "
                                        r"num_attention_heads \(14\)"):
        _qwen05_plan(4, gpus=4)


def test_worker_refuses_a_model_whose_heads_the_size_does_not_divide(model_dirs):
    from transformers import AutoModelForCausalLM

    from verl.utils import ulysses

    model = AutoModelForCausalLM.from_pretrained(model_dirs["kv2"])   # 4 heads
    with pytest.raises(ValueError, match=r"critic.ulysses_sequence_parallel_size=3 must divide the model's "
                                         r"num_attention_heads \(4\)"):
        ulysses.install(model, 3, "critic.ulysses_sequence_parallel_size")


def test_config_check_accepts_ulysses_and_names_a_bad_size():
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "trainer"))
    from omegaconf import OmegaConf
    from test_config import QUICKSTART_PPO

    from verl.trainer.config_check import ConfigError, load_config, validate

    base = load_config(QUICKSTART_PPO)

    def changed(*dotlist):
        return OmegaConf.merge(base, OmegaConf.from_dotlist(["trainer.n_gpus_per_node=2", *dotlist]))

    assert validate(changed("actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
                            "critic.ulysses_sequence_parallel_size=2")) == []
    for key in ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic"):
        with pytest.raises(ConfigError, match=rf"{key}.ulysses_sequence_parallel_size=3 must divide "
                                              r"trainer.n_gpus_per_node × trainer.nnodes = 2"):
            validate(changed(f"{key}.ulysses_sequence_parallel_size=3"))
    with pytest.raises(ConfigError, match=r"critic.ulysses_sequence_parallel_size=0 must be a positive integer"):
        validate(changed("critic.ulysses_sequence_parallel_size=0"))
