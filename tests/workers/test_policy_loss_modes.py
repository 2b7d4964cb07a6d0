"""Every `actor.policy_loss.loss_mode` the config check accepts trains the real FSDP actor on CPU: the
update runs, moves the weights, and reports a finite pg_loss (the formulas themselves are checked
against float64 references in tests/algos/test_upstream_algos.py)."""
import math
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from worker_setup import actor_rollout_ref_config, cpu_plan, ppo_batch, tiny_model, whole  # noqa: E402

from verl.trainer.config_check import POLICY_LOSS_MODES  # noqa: E402
from verl.workers.fsdp_workers import ActorRolloutRefWorker  # noqa: E402

# upstream's defaults for the mode-specific keys, with the *_cov ratios raised so a tiny batch has
# covariance outliers to act on
POLICY_LOSS = {"clip_cov_ratio": 0.2, "clip_cov_lb": -10.0, "clip_cov_ub": 10.0, "kl_cov_ratio": 0.2,
               "ppo_kl_coef": 0.1, "dro_beta": 0.1}   # dro_beta has no default (upstream: the user sets it)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tiny_model(str(tmp_path_factory.mktemp("tiny_loss_modes")))


@pytest.mark.parametrize("loss_mode", POLICY_LOSS_MODES)
def test_loss_mode_trains_the_actor(model_dir, loss_mode):
    config = actor_rollout_ref_config(model_dir, policy_loss={"loss_mode": loss_mode, **POLICY_LOSS},
                                      tau_pos=1.0, tau_neg=1.05)
    worker = ActorRolloutRefWorker(config, role="actor_rollout", plan=cpu_plan(model_dir))
    worker.init_model()
    data = ppo_batch()
    data.batch["old_log_probs"] = worker.compute_log_prob(data).batch["old_log_probs"]
    before = [whole(p.detach()).clone() for p in worker.actor_module.parameters()]
    metrics = worker.update_actor(data).meta_info["metrics"]
    after = [whole(p.detach()) for p in worker.actor_module.parameters()]
    assert any(not torch.equal(a, b) for a, b in zip(before, after))
    assert metrics["actor/pg_loss"] and all(math.isfinite(v) for v in metrics["actor/pg_loss"])
