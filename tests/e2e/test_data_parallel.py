"""Two CPU workers on Ray (FSDP world size 2, gloo) train exactly like one worker.

Same seed and data, PPO with a critic, 3 steps. Decoding is greedy with ignore_eos so both layouts
generate the same responses (sampling streams are per rank by design); balance_batch is off and the
mini-batch is the whole batch, so both layouts take the same optimizer steps. Losses, gradient norms
and values must agree to a relative 1e-4 (float32 reduction order differs between the layouts);
pg_loss is ~1e-7 here (advantages are whitened, the ratio starts at 1), so it is compared absolutely.
"""
import pytest
from conftest import run_main_ppo

RELATIVE = ("actor/grad_norm", "actor/entropy", "critic/vf_loss", "critic/grad_norm", "critic/values/mean",
            "critic/advantages/max")


def command(task, n_workers: int) -> list[str]:
    model, train, test = task
    return [
        f"data.train_files={train}", f"data.val_files={test}", "data.shuffle=False",
        "data.train_batch_size=32", "data.max_prompt_length=48", "data.max_response_length=8",
        "data.dataloader_num_workers=0",
        f"actor_rollout_ref.model.path={model}", "actor_rollout_ref.actor.optim.lr=1e-2",
        "actor_rollout_ref.actor.ppo_mini_batch_size=32", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.rollout.do_sample=False",
        "actor_rollout_ref.rollout.ignore_eos=True", "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8",
        f"critic.model.path={model}", "critic.optim.lr=1e-2", "critic.ppo_micro_batch_size_per_gpu=8",
        "custom_reward_function.path=examples/demo/reward.py",
        "trainer.logger=[file]", "trainer.val_before_train=False", "trainer.test_freq=-1",
        "trainer.balance_batch=False", "trainer.save_freq=-1", "trainer.nnodes=1",
        f"trainer.n_gpus_per_node={n_workers}", "trainer.total_epochs=2", "trainer.total_training_steps=3",
    ]


@pytest.mark.slow
def test_two_cpu_workers_match_one(copy_task, tmp_path):
    runs = {}
    for n in (1, 2):
        proc, steps = run_main_ppo(command(copy_task, n), log_path=tmp_path / f"workers{n}.jsonl")
        assert proc.returncode == 0
        assert f"Worker processes: {n}," in proc.stdout
        runs[n] = steps
    assert sorted(runs[1]) == sorted(runs[2]) == [1, 2, 3]
    for step in (1, 2, 3):
        one, two = runs[1][step], runs[2][step]
        for key in RELATIVE:
            assert two[key] == pytest.approx(one[key], rel=1e-4, abs=1e-6), (step, key)
        assert two["actor/pg_loss"] == pytest.approx(one["actor/pg_loss"], abs=1e-5), step
    assert runs[1][1]["actor/grad_norm"] > 0.1  # the compared updates are real, not zero


@pytest.mark.slow
def test_ulysses_two_ranks_match_data_parallel(copy_task, tmp_path):
    """main_ppo on 2 CPU workers with Ulysses size 2 for actor, reference and critic (one sequence-parallel
    group, data-parallel size 1) trains like 2 data-parallel workers: 2 steps, same tolerances as above.
    The plan printed at start names the sequence-parallel size."""
    ulysses = ["actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
               "actor_rollout_ref.ref.ulysses_sequence_parallel_size=2", "critic.ulysses_sequence_parallel_size=2"]
    base = [a for a in command(copy_task, 2) if not a.startswith("trainer.total_training_steps")]
    base += ["trainer.total_training_steps=2", "actor_rollout_ref.actor.use_kl_loss=True",
             "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8"]
    runs = {}
    for sp, extra in ((1, []), (2, ulysses)):
        proc, steps = run_main_ppo(base + extra, log_path=tmp_path / f"sp{sp}.jsonl")
        assert proc.returncode == 0, proc.stdout[-3000:]
        runs[sp] = steps
    assert "sequence_parallel_size" in proc.stdout and "Ulysses" in proc.stdout
    assert sorted(runs[1]) == sorted(runs[2]) == [1, 2]
    for step in (1, 2):
        one, two = runs[1][step], runs[2][step]
        for key in (*RELATIVE, "actor/kl_loss"):
            assert two[key] == pytest.approx(one[key], rel=1e-4, abs=1e-6), (step, key)
        assert two["actor/pg_loss"] == pytest.approx(one["actor/pg_loss"], abs=1e-5), step
    assert runs[1][1]["actor/grad_norm"] > 0.1
