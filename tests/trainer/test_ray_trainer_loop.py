"""RayPPOTrainer.fit against scripted in-process worker groups (no Ray, no models).

Checks the step order, what each stage receives, the metric names upstream dashboards read, validation
naming, critic warmup, KL-in-reward, and that a NaN loss stops the run with an actionable error after
the step was logged.
"""
import json
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from verl.protocol import DataProto
from verl.trainer.ppo.ray_trainer import (
    RayPPOTrainer,
    ResourcePoolManager,
    Role,
    TrainingDivergedError,
)
from verl.utils.dataset.rl_dataset import collate_fn

PROMPT_LEN, RESPONSE_LEN, VOCAB = 4, 3, 11


class FakeWorkerGroup:
    """Stands in for the actor/rollout/ref and critic worker groups; records every call."""

    world_size = 1

    def __init__(self, calls, pg_loss=0.5, grad_norms=None):
        self.calls = calls
        self.pg_loss = pg_loss
        self.grad_norms = list(grad_norms or [])   # the actor's grad norm at each update, when given
        self.seen = {}

    def generate_sequences(self, gen_batch):
        self.calls.append("gen")
        self.seen["gen_meta"] = dict(gen_batch.meta_info)
        self.seen["gen_len"] = len(gen_batch)
        n = len(gen_batch)
        prompts = gen_batch.batch["input_ids"]
        # Response token 0 is the row index mod VOCAB, so rewards differ within a GRPO group.
        responses = (torch.arange(n).unsqueeze(-1) + torch.zeros(n, RESPONSE_LEN, dtype=torch.long)) % VOCAB
        attention = torch.cat([gen_batch.batch["attention_mask"], torch.ones(n, RESPONSE_LEN, dtype=torch.long)], -1)
        attention[0, -1] = 0  # one response ends early
        return DataProto.from_dict(tensors={
            "prompts": prompts, "responses": responses, "input_ids": torch.cat([prompts, responses], -1),
            "attention_mask": attention, "position_ids": torch.cumsum(attention, -1) - 1,
        })

    def compute_log_prob(self, batch):
        self.calls.append("old_log_prob")
        n = len(batch)
        return DataProto.from_dict(tensors={"old_log_probs": torch.full((n, RESPONSE_LEN), -1.0),
                                            "entropys": torch.full((n, RESPONSE_LEN), 2.0)})

    def compute_ref_log_prob(self, batch):
        self.calls.append("ref")
        return DataProto.from_dict(tensors={"ref_log_prob": torch.full((len(batch), RESPONSE_LEN), -1.5)})

    def compute_values(self, batch):
        self.calls.append("values")
        self.seen["values_has_old_log_probs"] = "old_log_probs" in batch.batch
        return DataProto.from_dict(tensors={"values": torch.zeros(len(batch), RESPONSE_LEN)})

    def update_critic(self, batch):
        self.calls.append("update_critic")
        self.seen["critic_has_returns"] = "returns" in batch.batch
        return DataProto(meta_info={"metrics": {"critic/vf_loss": [0.25, 0.75]}})

    def update_actor(self, batch):
        self.calls.append("update_actor")
        self.seen["actor_batch"] = batch
        metrics = {"actor/pg_loss": [self.pg_loss], "actor/ppo_kl": [0.0], "actor/pg_clipfrac": [0.0],
                   "perf/max_memory_allocated_gb": [0.1]}
        if self.grad_norms:
            metrics["actor/grad_norm"] = [self.grad_norms.pop(0)]
        return DataProto(meta_info={"metrics": metrics})


def reward_fn(data, return_dict=False):
    """Score 1 when the first response token is even."""
    scores = (data.batch["responses"][:, 0] % 2 == 0).float()
    reward = torch.zeros(data.batch["responses"].shape)
    reward[:, 0] = scores
    return {"reward_tensor": reward, "reward_extra_info": {}} if return_dict else reward


def make_dataset(n):
    rows = []
    for i in range(n):
        ids = torch.tensor([1, 2, 3, 4 + i % 5])
        rows.append({"input_ids": ids, "attention_mask": torch.ones(PROMPT_LEN, dtype=torch.long),
                     "position_ids": torch.arange(PROMPT_LEN), "data_source": "toy",
                     "reward_model": {"ground_truth": "0"}, "extra_info": {"index": i}})
    return rows


def make_config(tmp_path, **overrides):
    cfg = OmegaConf.create({
        "data": {"train_batch_size": 4, "val_batch_size": None, "dataloader_num_workers": 0, "shuffle": False},
        "actor_rollout_ref": {
            "hybrid_engine": True,
            "actor": {"use_kl_loss": False, "loss_agg_mode": "token-mean", "grad_clip": 1.0, "optim": {"lr": 1e-6}},
            "rollout": {"n": 2, "temperature": 1.0, "val_kwargs": {"n": 1, "do_sample": False}},
        },
        "critic": {"optim": {"lr": 1e-5}},
        "algorithm": {"adv_estimator": "gae", "gamma": 1.0, "lam": 1.0, "norm_adv_by_std_in_grpo": True,
                      "use_kl_in_reward": False, "kl_penalty": "kl",
                      "kl_ctrl": {"type": "fixed", "kl_coef": 0.1, "horizon": 10000, "target_kl": 0.1}},
        "trainer": {"total_epochs": 1, "total_training_steps": None, "project_name": "p", "experiment_name": "e",
                    "logger": ["file"], "val_before_train": True, "test_freq": 2, "critic_warmup": 0,
                    "balance_batch": True, "save_freq": -1, "resume_mode": "auto",
                    "default_local_dir": str(tmp_path / "checkpoints")},
    })
    for key, value in overrides.items():
        OmegaConf.update(cfg, key, value)
    return cfg


def make_trainer(cfg, calls, use_critic=True, pg_loss=0.5, grad_norms=None):
    roles = {Role.ActorRollout: object}
    if use_critic:
        roles[Role.Critic] = object
    pool = ResourcePoolManager(resource_pool_spec={"global_pool": [1]}, mapping={r: "global_pool" for r in roles})
    trainer = RayPPOTrainer(config=cfg, tokenizer=type("T", (), {"eos_token_id": 9, "pad_token_id": 0})(),
                            role_worker_mapping=roles, resource_pool_manager=pool, reward_fn=reward_fn,
                            val_reward_fn=reward_fn, train_dataset=make_dataset(8), val_dataset=make_dataset(3),
                            collate_fn=collate_fn, train_sampler=torch.utils.data.SequentialSampler(range(8)))
    wg = FakeWorkerGroup(calls, pg_loss, grad_norms)
    trainer.actor_rollout_wg = trainer.ref_policy_wg = trainer.critic_wg = wg
    return trainer, wg


def read_log(path):
    return [json.loads(line) for line in open(path)]


def test_ppo_step_order_metrics_and_validation(tmp_path, monkeypatch):
    log = tmp_path / "log.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(log))
    cfg = make_config(tmp_path, **{"algorithm.use_kl_in_reward": True})
    calls = []
    trainer, wg = make_trainer(cfg, calls)
    assert trainer.total_training_steps == 2  # 8 prompts / batch 4, one epoch
    assert cfg.actor_rollout_ref.actor.optim.total_training_steps == 2
    assert cfg.critic.optim.total_training_steps == 2
    trainer.fit()

    step = ["gen", "old_log_prob", "ref", "values", "update_critic", "update_actor"]
    # validation before training, two steps, validation on the last step (test_freq=2)
    assert calls == ["gen"] + step + step + ["gen"]
    records = read_log(log)
    assert [r["step"] for r in records] == [0, 1, 2]
    assert records[0]["data"]["val-core/toy/reward/mean@1"] == pytest.approx(2 / 3)  # rows 0,1,2 -> 0 and 2 even
    m = records[1]["data"]
    for key in ["critic/score/mean", "critic/score/max", "critic/score/min", "critic/rewards/mean",
                "critic/advantages/mean", "critic/returns/mean", "critic/values/mean", "critic/vf_explained_var",
                "actor/pg_loss", "actor/entropy", "actor/reward_kl_penalty", "actor/reward_kl_penalty_coeff",
                "critic/vf_loss", "response_length/mean", "response_length/clip_ratio", "prompt_length/mean",
                "timing_s/gen", "timing_s/reward", "timing_s/old_log_prob", "timing_s/ref", "timing_s/values",
                "timing_s/adv", "timing_s/update_critic", "timing_s/update_actor", "timing_s/step",
                "timing_per_token_ms/gen", "perf/throughput", "perf/total_num_tokens", "perf/time_per_step",
                "perf/max_memory_allocated_gb", "training/global_step", "training/epoch"]:
        assert key in m, key
    assert "timing_s/testing" in records[2]["data"] and "val-core/toy/reward/mean@1" in records[2]["data"]
    assert m["critic/score/mean"] == pytest.approx(0.5)  # 8 responses, rows 0..7: half even
    assert m["critic/vf_loss"] == pytest.approx(0.5)     # mean over the workers' values
    assert m["actor/entropy"] == pytest.approx(2.0)
    # KL in reward: kl estimator "kl" = old - ref = 0.5 per token, beta 0.1
    assert m["actor/reward_kl_penalty"] == pytest.approx(0.5)
    assert m["critic/rewards/mean"] == pytest.approx(0.5 - 0.1 * 0.5 * (RESPONSE_LEN * 8 - 1) / 8)
    assert m["response_length/max"] == RESPONSE_LEN and m["response_length/min"] == RESPONSE_LEN - 1
    assert m["perf/total_num_tokens"] == 8 * (PROMPT_LEN + RESPONSE_LEN) - 1

    assert wg.seen["gen_len"] == 1 * 3  # last call: validation on 3 prompts, val n=1
    assert wg.seen["gen_meta"]["validate"] is True and wg.seen["gen_meta"]["do_sample"] is False
    assert wg.seen["values_has_old_log_probs"] and wg.seen["critic_has_returns"]


def test_first_step_record_carries_the_startup_breakdown(tmp_path, monkeypatch, capsys):
    """timing_s/startup (process start to the first step) and its stages in step 1's record only; the
    table is printed once, before that step."""
    from verl.utils.startup import clock as startup

    log = tmp_path / "log.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(log))
    monkeypatch.setattr(startup, "_CLOCK", None)
    monkeypatch.setattr(startup, "_ENDED", True)   # this run's clock starts now, not at pytest's start
    clock = startup.startup_clock()
    clock.mark("config")
    trainer, _ = make_trainer(make_config(tmp_path), [])
    trainer.fit()
    records = read_log(log)
    first, last = records[1]["data"], records[2]["data"]
    stages = ("config", "logger_checkpoint", "validation")
    assert sum(first[f"timing_s/startup/{s}"] for s in stages) == pytest.approx(first["timing_s/startup"])
    assert not any(k.startswith("timing_s/startup") for k in last)
    assert not any(k.startswith("timing_s/startup") for k in records[0]["data"])   # the validation record
    assert capsys.readouterr().out.count("verl start-up:") == 1
    assert startup.startup_clock() is not clock   # a later run in this process gets its own clock


def test_grpo_groups_by_prompt_and_critic_warmup(tmp_path, monkeypatch):
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(tmp_path / "log.jsonl"))
    cfg = make_config(tmp_path, **{"algorithm.adv_estimator": "grpo", "trainer.val_before_train": False,
                                   "trainer.test_freq": -1, "trainer.critic_warmup": 2,
                                   "trainer.balance_batch": False})
    calls = []
    trainer, wg = make_trainer(cfg, calls, use_critic=False)
    trainer.fit()
    # critic_warmup=2: the actor is updated from step 2 on; no critic, no ref, no validation
    assert calls == ["gen", "old_log_prob", "gen", "old_log_prob", "update_actor"]
    batch = wg.seen["actor_batch"]
    uids = batch.non_tensor_batch["uid"]
    assert len(batch) == 8 and len(set(uids)) == 4
    assert all(uids[2 * i] == uids[2 * i + 1] for i in range(4))  # rollout.n=2 copies sit side by side
    # each group holds one even and one odd row -> advantages +-0.5/std (unbiased std of {0,1} = 0.7071)
    adv = batch.batch["advantages"][:, 0]
    assert torch.allclose(adv.abs(), torch.full((8,), 0.5 / np.sqrt(0.5)), atol=1e-4)


def test_nan_loss_stops_with_actionable_error_after_logging(tmp_path, monkeypatch):
    log = tmp_path / "log.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(log))
    cfg = make_config(tmp_path, **{"trainer.val_before_train": False, "trainer.test_freq": -1})
    trainer, _ = make_trainer(cfg, [], pg_loss=float("nan"))
    with pytest.raises(TrainingDivergedError, match="actor_rollout_ref.actor.optim.lr"):
        trainer.fit()
    records = read_log(log)  # the failing step is on disk, the file closed cleanly
    assert [r["step"] for r in records] == [1] and records[0]["data"]["actor/pg_loss"] == "nan"


def test_updates_skipped_for_five_steps_in_a_row_stop_training(tmp_path, monkeypatch):
    """A non-finite grad norm skips the optimizer step with a warning; a finite one resets the count; the
    fifth non-finite step in a row stops training with an error naming what to try, after logging it."""
    from verl.trainer.ppo.ray_trainer import SKIPPED_UPDATES_LIMIT

    log = tmp_path / "log.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(log))
    cfg = make_config(tmp_path, **{"trainer.val_before_train": False, "trainer.test_freq": -1,
                                   "trainer.total_training_steps": 12, "trainer.total_epochs": 12})
    nan = float("nan")
    norms = [nan, nan, nan, nan, 1.0] + [nan] * SKIPPED_UPDATES_LIMIT + [1.0, 1.0]
    trainer, _ = make_trainer(cfg, [], grad_norms=norms)
    with pytest.raises(TrainingDivergedError, match="actor_rollout_ref.model.attn_implementation=eager"):
        trainer.fit()
    records = read_log(log)
    assert [r["step"] for r in records] == list(range(1, 11))   # stopped at step 10, logged first
    assert records[-1]["data"]["actor/grad_norm"] == "nan" and records[4]["data"]["actor/grad_norm"] == 1.0


def test_a_grad_scaler_may_skip_longer_while_its_scale_settles(tmp_path, monkeypatch):
    """With an fp16 grad scaler in the actor's plan (the planner's, for a T4), the same skipped steps are
    the scaler halving its scale: training goes on."""
    from verl.compat.__main__ import plan_for
    from verl.trainer.ppo.ray_trainer import SCALED_SKIPPED_UPDATES_LIMIT, SKIPPED_UPDATES_LIMIT

    _, _, t4 = plan_for(["data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
                         "actor_rollout_ref.actor.use_dynamic_bsz=true", "trainer.n_gpus_per_node=1"],
                        device="t4", model_spec="qwen2.5-0.5b")
    assert t4.actor.grad_scaler

    assert SCALED_SKIPPED_UPDATES_LIMIT > SKIPPED_UPDATES_LIMIT + 1
    log = tmp_path / "log.jsonl"
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(log))
    cfg = make_config(tmp_path, **{"trainer.val_before_train": False, "trainer.test_freq": -1,
                                   "trainer.total_training_steps": 8, "trainer.total_epochs": 8})
    trainer, _ = make_trainer(cfg, [], grad_norms=[float("nan")] * (SKIPPED_UPDATES_LIMIT + 1) + [1.0, 1.0])
    trainer.plan = t4
    trainer.fit()
    assert [r["step"] for r in read_log(log)] == list(range(1, 9))


def test_workers_receive_the_plan(tmp_path, monkeypatch):
    """init_workers builds ActorRolloutRefWorker and CriticWorker with `plan`, an argument their
    constructors accept (compat.numerics_guard reaches them inside the plan's role plans)."""
    import inspect

    from verl.trainer.ppo import ray_trainer
    from verl.workers.fsdp_workers import ActorRolloutRefWorker, CriticWorker

    cfg = make_config(tmp_path)
    roles = {Role.ActorRollout: ActorRolloutRefWorker, Role.Critic: CriticWorker}
    pool = ResourcePoolManager(resource_pool_spec={"global_pool": [1]}, mapping={r: "global_pool" for r in roles})
    monkeypatch.setattr(pool, "create_resource_pool", lambda: pool.resource_pool_dict.update(global_pool="pool"))
    plan = SimpleNamespace(device_type="cpu")
    built = {}
    monkeypatch.setattr(ray_trainer, "create_colocated_worker_cls", lambda class_dict: built.update(class_dict))

    class FakeGroup:
        world_size = 1

        def __init__(self, resource_pool, ray_cls_with_init):
            pass

        def spawn(self, prefix_set):
            return {name: SimpleNamespace(init_model=lambda: None) for name in prefix_set}

    trainer = RayPPOTrainer(config=cfg, tokenizer=None, role_worker_mapping=roles, resource_pool_manager=pool,
                            ray_worker_group_cls=FakeGroup, reward_fn=reward_fn, train_dataset=make_dataset(8),
                            val_dataset=make_dataset(3), collate_fn=collate_fn,
                            train_sampler=torch.utils.data.SequentialSampler(range(8)), plan=plan)
    trainer.init_workers()
    assert set(built) == {"actor_rollout", "critic"}
    for name, cls in (("actor_rollout", ActorRolloutRefWorker), ("critic", CriticWorker)):
        spec = built[name]
        assert spec.user_cls is cls
        assert spec.kwargs["plan"] is plan
        inspect.signature(cls).bind(*spec.args, **spec.kwargs)   # the constructor takes exactly these


def test_an_error_inside_the_reward_function_is_not_retried(tmp_path, monkeypatch):
    """A TypeError raised by the user's scoring code surfaces as is, after one call."""
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(tmp_path / "log.jsonl"))
    calls = []

    def broken_reward(data, return_dict=False):
        calls.append(return_dict)
        return None + 1     # a bug in the user's function

    cfg = make_config(tmp_path, **{"trainer.val_before_train": False, "trainer.test_freq": -1})
    trainer, _ = make_trainer(cfg, [])
    trainer.reward_fn = broken_reward
    with pytest.raises(TypeError, match="NoneType"):
        trainer.fit()
    assert calls == [True]


def test_a_reward_function_without_return_dict_gives_just_the_tensor(tmp_path, monkeypatch):
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(tmp_path / "log.jsonl"))
    cfg = make_config(tmp_path, **{"trainer.val_before_train": False, "trainer.test_freq": -1,
                                   "trainer.total_training_steps": 1})
    trainer, _ = make_trainer(cfg, [])
    trainer.reward_fn = lambda data: reward_fn(data)
    trainer.fit()
    assert read_log(tmp_path / "log.jsonl")[0]["data"]["critic/score/mean"] == pytest.approx(0.5)


def test_a_nan_score_from_a_custom_reward_manager_blames_the_reward(tmp_path, monkeypatch):
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(tmp_path / "log.jsonl"))
    cfg = make_config(tmp_path, **{"trainer.val_before_train": False, "trainer.test_freq": -1})
    trainer, _ = make_trainer(cfg, [])

    def nan_reward(data, return_dict=False):
        tensor = reward_fn(data)
        return tensor * float("nan")

    trainer.reward_fn = nan_reward
    with pytest.raises(TrainingDivergedError, match="reward function returned a non-finite score") as err:
        trainer.fit()
    assert "lr" not in str(err.value)


def test_validation_generates_in_pieces_and_shows_progress(tmp_path, monkeypatch, capsys):
    """5 validation prompts x val n=1 with a 2-sequence engine chunk: three generate calls (2, 2, 1), a
    progress bar that reaches 5/5, and every prompt scored exactly once in the right order."""
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(tmp_path / "log.jsonl"))
    cfg = make_config(tmp_path, **{"trainer.val_only": True, "actor_rollout_ref.rollout.micro_batch_size": 2})
    trainer, wg = make_trainer(cfg, [])
    trainer.val_dataset = make_dataset(5)
    trainer.val_dataloader = torch.utils.data.DataLoader(trainer.val_dataset, batch_size=5, collate_fn=collate_fn)
    sizes = []
    generate = wg.generate_sequences
    wg.generate_sequences = lambda batch: sizes.append(len(batch)) or generate(batch)
    trainer.fit()
    assert sizes == [2, 2, 1]
    err = capsys.readouterr().err
    assert "Validation" in err and "5/5" in err
    # the fake's reward: 1 for an even response token, which restarts at 0 in every call -> rows 0,1 | 0,1 | 0
    assert read_log(tmp_path / "log.jsonl")[0]["data"]["val-core/toy/reward/mean@1"] == pytest.approx(3 / 5)


def test_validation_logs_the_largest_peak_of_its_generate_calls(tmp_path, monkeypatch):
    """Each validation generate call reports its own allocator peak; the step's record keeps the largest,
    so the plan's validation phase can be checked against it (the other worker metrics stay dropped)."""
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(tmp_path / "log.jsonl"))
    cfg = make_config(tmp_path, **{"trainer.val_only": True, "actor_rollout_ref.rollout.micro_batch_size": 2})
    trainer, wg = make_trainer(cfg, [])
    trainer.val_dataset = make_dataset(5)
    trainer.val_dataloader = torch.utils.data.DataLoader(trainer.val_dataset, batch_size=5, collate_fn=collate_fn)
    peaks = iter([3.0, 5.5, 4.0])
    generate = wg.generate_sequences

    def with_peak(batch):
        out = generate(batch)
        out.meta_info["metrics"] = {"perf/max_memory_allocated_gb/validation": [next(peaks)], "other/x": [1.0]}
        return out

    wg.generate_sequences = with_peak
    trainer.fit()
    data = read_log(tmp_path / "log.jsonl")[0]["data"]
    assert data["perf/max_memory_allocated_gb/validation"] == 5.5 and "other/x" not in data
@pytest.mark.parametrize("estimator", ["opo", "grpo_passk", "gpg", "rloo_vectorized", "grpo_vectorized", "remax"])
def test_every_upstream_estimator_runs_through_the_step(tmp_path, monkeypatch, estimator):
    """The estimators the config check accepts run in fit(); remax first asks for one greedy response per
    prompt and its reward becomes the baseline of that prompt's rollout.n samples."""
    monkeypatch.setenv("VERL_FILE_LOGGER_PATH", str(tmp_path / "log.jsonl"))
    cfg = make_config(tmp_path, **{"algorithm.adv_estimator": estimator, "trainer.val_before_train": False,
                                   "trainer.test_freq": -1, "trainer.total_training_steps": 1,
                                   "trainer.balance_batch": False})
    calls = []
    trainer, wg = make_trainer(cfg, calls, use_critic=False)
    metas = []
    generate = wg.generate_sequences
    wg.generate_sequences = lambda batch: (metas.append((len(batch), dict(batch.meta_info))), generate(batch))[1]
    trainer.fit()
    batch = wg.seen["actor_batch"]
    adv = batch.batch["advantages"]
    assert torch.isfinite(adv).all() and adv.abs().sum() > 0
    if estimator != "remax":
        assert calls == ["gen", "old_log_prob", "update_actor"] and len(metas) == 1
        return
    assert calls == ["gen", "gen", "old_log_prob", "update_actor"]
    (greedy_len, greedy_meta), (sampled_len, sampled_meta) = metas
    assert greedy_len == 4 and greedy_meta["do_sample"] is False and sampled_len == 8
    assert sampled_meta.get("do_sample", True) is not False
    # the fake engine's greedy response for prompt p starts with token p: reward 1 for even p
    baselines = batch.batch["reward_baselines"]
    assert baselines.tolist() == [1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0]
    scores = batch.batch["token_level_scores"].sum(-1)
    torch.testing.assert_close(adv[:, 0], (scores - baselines) * batch.batch["response_mask"][:, 0])
    assert "timing_s/gen_max" in json.loads(open(tmp_path / "log.jsonl").readline())["data"]
