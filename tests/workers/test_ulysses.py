"""Ulysses sequence parallelism (`ulysses_sequence_parallel_size`) on 2 gloo ranks against size 1.

With sp=2 on 2 ranks (data-parallel size 1) each rank runs half of every micro-batch's sequence and
attention exchanges heads for sequence (all-to-all: gloo has it in torch 2.13). Actor log-probs and
entropies, reference log-probs, critic values and the gradients of one actor and one critic update
equal one rank's without sequence parallelism, for padded and packed (use_remove_padding) micro-batches,
with SDPA, eager (one key/value head: repeated to 2 before the exchange) and torch_varlen (its CPU
reference kernel). Tolerance: float32, 1e-5 relative / 1e-6 absolute (only the order of the
reductions inside attention and the gradient sum changes).
"""
import os
import sys

import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from worker_setup import run_ranks, tiny_model  # noqa: E402

VARIANTS = [("kv2", "sdpa-padded"), ("kv2", "sdpa-packed"), ("kv1", "eager-padded"), ("kv2", "torch_varlen-packed")]
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
