"""The stock command on a real two-node Ray cluster (CPU): same numbers as one node, and a node dying mid-run.

The cluster (tests/e2e/ray_cluster.py) has a head and two worker nodes, separate raylets on this machine
that advertise one CPU each, so `trainer.nnodes=2 trainer.n_gpus_per_node=1` (two CPU workers, FSDP world
size 2 over gloo) must put its workers on two different nodes. main_ppo runs in a subprocess and attaches
through RAY_ADDRESS, as a user's driver does; this test process never joins that cluster.

The reference is the same command on one node (`nnodes=1 n_gpus_per_node=2`, its own local Ray): same
world size, ranks and reduction order, so losses, gradient norms and values agree to rel 1e-5 (float32
round-off; in practice they are equal). Decoding is greedy and the data unshuffled so both runs see the
same batches and responses.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time

import pytest
from conftest import REPO_ROOT, file_metrics, run_main_ppo
from ray_cluster import LocalRayCluster

COMPARED = ("actor/pg_loss", "actor/grad_norm", "actor/entropy", "critic/vf_loss", "critic/grad_norm",
            "critic/values/mean", "critic/advantages/max", "critic/score/mean")
REFERENCE_STEPS = 6        # the killed run may finish a few more steps while its node's workers notice
DEATH_EXIT_TIMEOUT_S = 120    # from the node kill to the driver's exit
_PLACEMENT = re.compile(r"^\s+node ([0-9a-f]+) \(.*\): ranks \[([0-9, ]+)\]$", re.M)


def command(task, nnodes: int, per_node: int, steps: int, checkpoints=None, save_freq: int = -1) -> list[str]:
    model, train, test = task
    return [
        f"data.train_files={train}", f"data.val_files={test}", "data.shuffle=False",
        "data.train_batch_size=16", "data.max_prompt_length=48", "data.max_response_length=8",
        "data.dataloader_num_workers=0",
        f"actor_rollout_ref.model.path={model}", "actor_rollout_ref.actor.optim.lr=1e-2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=16", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.do_sample=False",
        "actor_rollout_ref.rollout.ignore_eos=True", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
        f"critic.model.path={model}", "critic.optim.lr=1e-2", "critic.ppo_micro_batch_size_per_gpu=8",
        "custom_reward_function.path=examples/demo/reward.py",
        "trainer.logger=[console,file]", "trainer.val_before_train=False", "trainer.test_freq=-1",
        "trainer.balance_batch=False", f"trainer.nnodes={nnodes}", f"trainer.n_gpus_per_node={per_node}",
        "trainer.total_epochs=20", f"trainer.total_training_steps={steps}", f"trainer.save_freq={save_freq}",
        f"trainer.default_local_dir={checkpoints}" if checkpoints else "trainer.resume_mode=disable",
    ]


def placement(stdout: str) -> dict[int, str]:
    """rank -> node id, from the driver's `Worker placement` lines (what each worker reported)."""
    return {int(rank): node for node, ranks in _PLACEMENT.findall(stdout) for rank in ranks.split(",")}


@pytest.fixture(scope="module")
def cluster():
    with LocalRayCluster([1, 1, 1], env={"PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}) as c:
        yield c


@pytest.fixture(scope="module")
def one_node(copy_task, tmp_path_factory):
    """The reference: the same command on one node, two workers, its own Ray."""
    log = tmp_path_factory.mktemp("one_node") / "metrics.jsonl"
    proc, steps = run_main_ppo(command(copy_task, 1, 2, REFERENCE_STEPS), log_path=log)
    assert proc.returncode == 0
    assert sorted(steps) == list(range(1, REFERENCE_STEPS + 1))
    assert steps[1]["actor/grad_norm"] > 0.1  # the compared updates are real, not zero
    return steps


def assert_same(steps, reference, compared_steps):
    for step in compared_steps:
        for key in COMPARED:
            assert steps[step][key] == pytest.approx(reference[step][key], rel=1e-5, abs=1e-7), (step, key)


@pytest.mark.slow
def test_two_nodes_match_one_node(cluster, one_node, copy_task, tmp_path):
    proc, steps = run_main_ppo(command(copy_task, 2, 1, 3), log_path=tmp_path / "two.jsonl",
                               ray_address=cluster.address)
    assert proc.returncode == 0
    assert f"Attached to the Ray cluster at {cluster.address}: 3 node(s)" in proc.stdout
    ranks = placement(proc.stdout)
    assert sorted(ranks) == [0, 1] and ranks[0] != ranks[1]          # one worker on each of two nodes
    assert set(ranks.values()) <= set(cluster.node_ids)
    assert "backend gloo" in proc.stdout                             # the plan's backend, printed with the plan
    assert sorted(steps) == [1, 2, 3]
    assert_same(steps, one_node, (1, 2, 3))


def _stream(proc, sink: list) -> None:
    for line in proc.stdout:
        sink.append(line)


@pytest.mark.slow
def test_node_death_exits_and_resumes_on_the_survivors(cluster, one_node, copy_task, tmp_path):
    checkpoints, tracker = tmp_path / "ckpt", tmp_path / "ckpt" / "latest_checkpointed_iteration.txt"
    env = {"PYTHONUNBUFFERED": "1", "RAY_ADDRESS": cluster.address, "VERL_FILE_LOGGER_PATH": str(tmp_path / "a.jsonl")}
    proc = subprocess.Popen([sys.executable, "-m", "verl.trainer.main_ppo",
                             *command(copy_task, 2, 1, 20, checkpoints, save_freq=1)],
                            cwd=REPO_ROOT, env={**os.environ, **env}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    output: list[str] = []
    reader = threading.Thread(target=_stream, args=(proc, output), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 360
        while not (tracker.exists() and int(tracker.read_text() or 0) >= 1):  # a step saved: kill mid-run
            assert proc.poll() is None and time.monotonic() < deadline, "".join(output)[-4000:]
            time.sleep(0.2)
        ranks = placement("".join(output))
        victim = next(node for node in ranks.values() if node != cluster.head_id)
        cluster.kill(victim)
        killed_at = time.monotonic()
        returncode = proc.wait(timeout=DEATH_EXIT_TIMEOUT_S)
        print(f"driver exited {time.monotonic() - killed_at:.1f} s after the node kill")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
    reader.join(timeout=30)
    text = "".join(output)
    assert returncode != 0, text[-4000:]
    dead_rank = next(rank for rank, node in ranks.items() if node == victim)
    # the error names the rank, its worker and its node ("now dead" once Ray's health checks have noticed)
    assert re.search(rf"worker rank {dead_rank} \(\S+ on node {victim}(, now dead)?\) died", text), text[-4000:]

    # the last checkpoint resumes on what is left: the head and the other worker node
    cluster.wait_dead(victim)
    saved = int(tracker.read_text())
    assert 1 <= saved < REFERENCE_STEPS, f"the killed run got to step {saved} before stopping"
    print(f"resuming from step {saved} on the surviving nodes")
    proc, resumed = run_main_ppo(command(copy_task, 2, 1, saved + 1, checkpoints, save_freq=1),
                                 log_path=tmp_path / "b.jsonl", ray_address=cluster.address)
    assert proc.returncode == 0
    assert "Attached to the Ray cluster" in proc.stdout and "2 node(s)" in proc.stdout
    assert victim not in placement(proc.stdout).values()
    assert f"global_step_{saved}" in proc.stdout and "Resuming from" in proc.stdout
    assert sorted(resumed) == [saved + 1]
    assert_same(resumed, one_node, (saved + 1,))
    assert_same(file_metrics(tmp_path / "a.jsonl"), one_node, range(1, saved + 1))  # the killed run's steps too
