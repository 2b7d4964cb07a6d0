"""The stock command in different worker layouts (CPU, FSDP over gloo) trains like one reference run.

The reference is one node with two workers (`nnodes=1 n_gpus_per_node=2`, its own local Ray), 6 steps.
Compared with it, step by step:
- one worker: the same optimizer steps with another float32 reduction order, so relative 1e-4;
- two workers with Ulysses size 2 for actor, reference and critic (one sequence-parallel group,
  data-parallel size 1): relative 1e-4;
- a real two-node Ray cluster (tests/e2e/ray_cluster.py: a head and two worker nodes, separate raylets on
  this machine advertising one CPU each, so `nnodes=2 n_gpus_per_node=1` must put its two workers on
  different nodes), main_ppo attaching through RAY_ADDRESS as a user's driver does: same world size,
  ranks and reduction order, so relative 1e-5. A worker node is killed mid-run: the driver exits naming
  the dead rank and its node, and the last checkpoint resumes on the two surviving nodes.

Same seed and unshuffled data; decoding is greedy with ignore_eos so every layout generates the same
responses (sampling streams are per rank by design); balance_batch is off and the mini-batch is the whole
batch, so all layouts take the same optimizer steps. The KL loss is on so the reference model runs too.
pg_loss is ~1e-7 here (advantages are whitened, the ratio starts at 1), so it is compared absolutely
where the tolerance is relative 1e-4. One reference serves every comparison: 5 runs instead of 8.
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

ACROSS_LAYOUTS = ("actor/grad_norm", "actor/entropy", "actor/kl_loss", "critic/vf_loss", "critic/grad_norm",
                  "critic/values/mean", "critic/advantages/max")
ACROSS_NODES = ("actor/pg_loss", "actor/grad_norm", "actor/entropy", "actor/kl_loss", "critic/vf_loss",
                "critic/grad_norm", "critic/values/mean", "critic/advantages/max", "critic/score/mean")
REFERENCE_STEPS = 6        # the killed run may finish a few more steps while its node's workers notice
KILL_AFTER_STEP = 2        # killed run's steps 1-2 and the resumed step 3 together cover steps 1-3 on two nodes
DEATH_EXIT_TIMEOUT_S = 120    # from the node kill to the driver's exit
_PLACEMENT = re.compile(r"^\s+node ([0-9a-f]+) \(.*\): ranks \[([0-9, ]+)\]$", re.M)
ULYSSES = ["actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
           "actor_rollout_ref.ref.ulysses_sequence_parallel_size=2", "critic.ulysses_sequence_parallel_size=2"]


def command(task, nnodes: int, per_node: int, steps: int, checkpoints=None, save_freq: int = -1) -> list[str]:
    model, train, test = task
    return [
        f"data.train_files={train}", f"data.val_files={test}", "data.shuffle=False",
        "data.train_batch_size=32", "data.max_prompt_length=48", "data.max_response_length=8",
        "data.dataloader_num_workers=0",
        f"actor_rollout_ref.model.path={model}", "actor_rollout_ref.actor.optim.lr=1e-2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=32", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.actor.use_kl_loss=True", "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8",
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
def reference(copy_task, tmp_path_factory):
    """One node, two workers, its own Ray: {step: metrics}."""
    log = tmp_path_factory.mktemp("reference") / "metrics.jsonl"
    proc, steps = run_main_ppo(command(copy_task, 1, 2, REFERENCE_STEPS), log_path=log)
    assert proc.returncode == 0
    assert "Worker processes: 2," in proc.stdout
    assert sorted(steps) == list(range(1, REFERENCE_STEPS + 1))
    assert steps[1]["actor/grad_norm"] > 0.1  # the compared updates are real, not zero
    return steps


def assert_close(steps, reference, compared_steps, keys, rel):
    """Each key within `rel` of the reference; pg_loss (~1e-7) absolutely where `rel` is loose."""
    for step in compared_steps:
        for key in keys:
            assert steps[step][key] == pytest.approx(reference[step][key], rel=rel, abs=1e-6 if rel > 1e-5 else 1e-7), \
                (step, key)
        if "actor/pg_loss" not in keys:
            assert steps[step]["actor/pg_loss"] == pytest.approx(reference[step]["actor/pg_loss"], abs=1e-5), step


@pytest.mark.slow
def test_one_worker_matches_two(reference, copy_task, tmp_path):
    proc, steps = run_main_ppo(command(copy_task, 1, 1, 3), log_path=tmp_path / "one.jsonl")
    assert proc.returncode == 0
    assert "Worker processes: 1," in proc.stdout
    assert sorted(steps) == [1, 2, 3]
    assert_close(steps, reference, (1, 2, 3), ACROSS_LAYOUTS, rel=1e-4)


@pytest.mark.slow
def test_ulysses_two_ranks_match_data_parallel(reference, copy_task, tmp_path):
    """The plan printed at start names the sequence-parallel size."""
    proc, steps = run_main_ppo(command(copy_task, 1, 2, 2) + ULYSSES, log_path=tmp_path / "sp2.jsonl")
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "sequence_parallel_size" in proc.stdout and "Ulysses" in proc.stdout
    assert sorted(steps) == [1, 2]
    assert_close(steps, reference, (1, 2), ACROSS_LAYOUTS, rel=1e-4)


@pytest.fixture(scope="module")
def cluster():
    with LocalRayCluster([1, 1, 1], env={"PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}) as c:
        yield c


def _stream(proc, sink: list) -> None:
    for line in proc.stdout:
        sink.append(line)


@pytest.mark.slow
def test_two_nodes_match_one_and_a_dead_node_resumes_on_the_survivors(cluster, reference, copy_task, tmp_path):
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
        while not (tracker.exists() and int(tracker.read_text() or 0) >= KILL_AFTER_STEP):  # then kill mid-run
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
    # before the kill: attached to the 3-node cluster, one worker on each of two nodes, gloo
    assert f"Attached to the Ray cluster at {cluster.address}: 3 node(s)" in text
    assert sorted(ranks) == [0, 1] and ranks[0] != ranks[1]
    assert set(ranks.values()) <= set(cluster.node_ids)
    assert "backend gloo" in text                                    # the plan's backend, printed with the plan
    assert returncode != 0, text[-4000:]
    dead_rank = next(rank for rank, node in ranks.items() if node == victim)
    # the error names the rank, its worker and its node ("now dead" once Ray's health checks have noticed)
    assert re.search(rf"worker rank {dead_rank} \(\S+ on node {victim}(, now dead)?\) died", text), text[-4000:]
    saved = int(tracker.read_text())
    assert KILL_AFTER_STEP <= saved < REFERENCE_STEPS, f"the killed run got to step {saved} before stopping"
    killed_steps = file_metrics(tmp_path / "a.jsonl")
    assert sorted(killed_steps)[:saved] == list(range(1, saved + 1))
    assert_close(killed_steps, reference, range(1, saved + 1), ACROSS_NODES, rel=1e-5)

    # the last checkpoint resumes on what is left: the head and the other worker node
    cluster.wait_dead(victim)
    print(f"resuming from step {saved} on the surviving nodes")
    proc, resumed = run_main_ppo(command(copy_task, 2, 1, saved + 1, checkpoints, save_freq=1),
                                 log_path=tmp_path / "b.jsonl", ray_address=cluster.address)
    assert proc.returncode == 0
    assert "Attached to the Ray cluster" in proc.stdout and "2 node(s)" in proc.stdout
    assert victim not in placement(proc.stdout).values()
    assert f"global_step_{saved}" in proc.stdout and "Resuming from" in proc.stdout
    assert sorted(resumed) == [saved + 1]
    assert_close(resumed, reference, (saved + 1,), ACROSS_NODES, rel=1e-5)
