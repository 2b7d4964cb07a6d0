"""verl.trainer.ppo.core_algos against independent float64 references written as plain loops.

References use Python floats token by token, per the formulas in the papers / upstream 0.9.1's docs.
Tolerances: float64 inputs 1e-9 (absolute, after the 1e-8 whitening/mean guards, which the
references reproduce); float32 inputs 1e-5.
"""

import math

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from verl.trainer.ppo import core_algos as ca

torch.set_num_threads(1)
TOL = dict(rtol=1e-9, atol=1e-9)


def _rand(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _mask(lengths, cols, holes=()):
    m = torch.zeros(len(lengths), cols, dtype=torch.float64)
    for i, n in enumerate(lengths):
        m[i, :n] = 1
    for i, j in holes:
        m[i, j] = 0
    return m


def _whiten_ref(x, m):
    vals = [float(x[i, j]) for i in range(x.shape[0]) for j in range(x.shape[1]) if m[i, j]]
    n = len(vals)
    mean = sum(vals) / (n + 1e-8)
    var = sum((v - mean) ** 2 for v in vals) / (n + 1e-8) * n / (n - 1)
    return [[(float(x[i, j]) - mean) / math.sqrt(var + 1e-8) for j in range(x.shape[1])] for i in range(x.shape[0])]


def _t(rows):
    return torch.tensor(rows, dtype=torch.float64)


# ---------------------------------------------------------------- registries and controllers


def test_registries_know_upstream_names():
    for name in ["gae", "grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"]:
        assert callable(ca.get_adv_estimator_fn(name))
    assert ca.get_adv_estimator_fn(ca.AdvantageEstimator.GRPO) is ca.compute_grpo_outcome_advantage
    assert ca.get_policy_loss_fn("vanilla") is ca.compute_policy_loss_vanilla
    with pytest.raises(ValueError, match="one of"):
        ca.get_adv_estimator_fn("nope")
    with pytest.raises(ValueError, match="loss_mode"):
        ca.get_policy_loss_fn("nope")


def test_register_custom_estimator_and_conflict():
    @ca.register_adv_est("my_test_est")
    def my_est(token_level_rewards, response_mask, **kw):
        return token_level_rewards, token_level_rewards

    assert ca.get_adv_estimator_fn("my_test_est") is my_est
    ca.register_adv_est("my_test_est")(my_est)  # same function again is fine
    with pytest.raises(ValueError, match="already registered"):
        ca.register_adv_est("my_test_est")(lambda **kw: None)
    del ca.ADV_ESTIMATOR_REGISTRY["my_test_est"]


def test_kl_controllers():
    fixed = ca.get_kl_controller(OmegaConf.create({"type": "fixed", "kl_coef": 0.05}))
    fixed.update(10.0, 100)
    assert isinstance(fixed, ca.FixedKLController) and fixed.value == 0.05

    ada = ca.get_kl_controller(OmegaConf.create({"type": "adaptive", "kl_coef": 0.1, "target_kl": 0.1, "horizon": 100}))
    ada.update(current_kl=0.15, n_steps=10)  # error 0.5 clipped to 0.2
    assert ada.value == pytest.approx(0.1 * (1 + 0.2 * 10 / 100))
    ada.update(current_kl=0.09, n_steps=10)  # error -0.1
    assert ada.value == pytest.approx(0.1 * 1.02 * (1 - 0.1 * 10 / 100))
    with pytest.raises(ValueError, match="horizon"):
        ca.get_kl_controller({"type": "adaptive", "kl_coef": 0.1, "target_kl": 0.1, "horizon": 0})
    with pytest.raises(ValueError, match="fixed"):
        ca.get_kl_controller({"type": "pid", "kl_coef": 0.1})


# ---------------------------------------------------------------- advantage estimators


def test_gae_matches_loop_reference_with_holes():
    B, T = 3, 6
    rewards, values = _rand(B, T, seed=1), _rand(B, T, seed=2)
    mask = _mask([6, 4, 5], T, holes=[(2, 2)])  # row 2 has an observation token inside the response
    gamma, lam = 0.9, 0.8
    adv, ret = ca.compute_gae_advantage_return(rewards, values, mask, gamma=gamma, lam=lam)

    raw = [[0.0] * T for _ in range(B)]
    for i in range(B):
        steps = [t for t in range(T) if mask[i, t]]  # GAE runs over valid tokens only
        last, nxt = 0.0, 0.0
        for t in reversed(steps):
            delta = float(rewards[i, t]) + gamma * nxt - float(values[i, t])
            last = delta + gamma * lam * last
            nxt = float(values[i, t])
            raw[i][t] = last
        carried = 0.0  # masked tokens hold the advantage of the next valid token
        for t in reversed(range(T)):
            if mask[i, t]:
                carried = raw[i][t]
            else:
                raw[i][t] = carried
    ref_ret = [[raw[i][t] + float(values[i, t]) for t in range(T)] for i in range(B)]
    torch.testing.assert_close(ret, _t(ref_ret), **TOL)
    torch.testing.assert_close(adv, _t(_whiten_ref(_t(raw), mask)), **TOL)


def test_grpo_groups_by_uid_and_single_sample_groups():
    B, T = 6, 4
    rewards = torch.zeros(B, T, dtype=torch.float64)
    scores = [1.0, 0.0, 0.5, 2.0, 3.0, 0.7]
    lengths = [4, 2, 3, 1, 4, 2]
    for i, (s, n) in enumerate(zip(scores, lengths)):
        rewards[i, n - 1] = s  # outcome reward on the last valid token
    mask = _mask(lengths, T)
    uid = np.array(["a", "b", "a", "b", "c", "a"], dtype=object)

    for norm in (True, False):
        adv, ret = ca.compute_grpo_outcome_advantage(rewards, mask, uid, norm_adv_by_std_in_grpo=norm)
        ref = []
        for i in range(B):
            group = [scores[j] for j in range(B) if uid[j] == uid[i]]
            if len(group) == 1:
                mean, std = 0.0, 1.0
            else:
                mean = sum(group) / len(group)
                std = math.sqrt(sum((g - mean) ** 2 for g in group) / (len(group) - 1))
            a = (scores[i] - mean) / (std + 1e-6) if norm else scores[i] - mean
            ref.append([a * float(mask[i, t]) for t in range(T)])
        torch.testing.assert_close(adv, _t(ref), **TOL)
        torch.testing.assert_close(ret, adv)


def test_grpo_identical_scores_give_zero_and_float32_input():
    rewards = torch.zeros(4, 3)
    rewards[:, -1] = 1.0
    adv, _ = ca.compute_grpo_outcome_advantage(rewards, torch.ones(4, 3), np.array([0, 0, 1, 1]))
    assert adv.dtype == torch.float32
    assert torch.equal(adv, torch.zeros(4, 3))


def test_rloo_leave_one_out():
    B, T = 5, 3
    scores = [1.0, 3.0, 0.0, 2.0, 5.0]
    rewards = torch.zeros(B, T, dtype=torch.float64)
    rewards[:, 0] = _t(scores)
    mask = _mask([3, 2, 3, 1, 2], T)
    uid = np.array(["x", "x", "x", "y", "z"], dtype=object)
    adv, ret = ca.compute_rloo_outcome_advantage(rewards, mask, uid)
    ref = []
    for i in range(B):
        others = [scores[j] for j in range(B) if uid[j] == uid[i] and j != i]
        a = scores[i] - sum(others) / len(others) if others else scores[i]
        ref.append([a * float(mask[i, t]) for t in range(T)])
    torch.testing.assert_close(adv, _t(ref), **TOL)


def test_reinforce_plus_plus_discounted_with_holes():
    B, T = 3, 5
    rewards = _rand(B, T, seed=3)
    mask = _mask([5, 3, 4], T, holes=[(0, 1)])
    gamma = 0.7
    adv, ret = ca.compute_reinforce_plus_plus_outcome_advantage(rewards, mask, config={"gamma": gamma})
    ref_ret = [[0.0] * T for _ in range(B)]
    for i in range(B):
        running = 0.0
        for t in reversed(range(T)):
            if mask[i, t]:
                running = float(rewards[i, t]) + gamma * running
                ref_ret[i][t] = running
    torch.testing.assert_close(ret, _t(ref_ret), **TOL)
    white = _whiten_ref(_t(ref_ret), mask)
    ref_adv = [[white[i][t] * float(mask[i, t]) for t in range(T)] for i in range(B)]
    torch.testing.assert_close(adv, _t(ref_adv), **TOL)
    with pytest.raises(ValueError, match="gamma"):
        ca.compute_reinforce_plus_plus_outcome_advantage(rewards, mask)


def test_reinforce_plus_plus_baseline():
    B, T = 5, 4
    scores = [1.0, 2.0, 4.0, 0.5, -1.0]
    rewards = torch.zeros(B, T, dtype=torch.float64)
    rewards[:, 0] = _t(scores)
    mask = _mask([4, 2, 3, 4, 1], T)
    uid = np.array([7, 7, 7, 8, 9])
    adv, _ = ca.compute_reinforce_plus_plus_baseline_outcome_advantage(rewards, mask, uid)
    centred = []
    for i in range(B):
        group = [scores[j] for j in range(B) if uid[j] == uid[i]]
        base = sum(group) / len(group) if len(group) > 1 else 0.0
        centred.append([(scores[i] - base) * float(mask[i, t]) for t in range(T)])
    white = _whiten_ref(_t(centred), mask)
    ref = [[white[i][t] * float(mask[i, t]) for t in range(T)] for i in range(B)]
    torch.testing.assert_close(adv, _t(ref), **TOL)


# ---------------------------------------------------------------- loss aggregation


def _agg_ref(loss, mask, mode, scale=None):
    rows = [[(float(loss[i, t]), float(mask[i, t])) for t in range(loss.shape[1]) if mask[i, t]]
            for i in range(loss.shape[0])]
    if mode == "token-mean":
        return sum(v * m for r in rows for v, m in r) / sum(m for r in rows for _, m in r)
    if mode == "token-sum":
        return sum(v * m for r in rows for v, m in r)
    live = [r for r in rows if sum(m for _, m in r) > 0]
    if mode == "seq-mean-token-mean":
        return sum(sum(v * m for v, m in r) / sum(m for _, m in r) for r in live) / len(live)
    seq_sum = sum(sum(v * m for v, m in r) for r in live) / len(live)
    if mode == "seq-mean-token-sum":
        return seq_sum
    return seq_sum / (loss.shape[1] if scale is None else scale)


@pytest.mark.parametrize("mode", ca.LOSS_AGG_MODES)
def test_agg_loss_modes_with_fully_masked_row(mode):
    loss = _rand(4, 6, seed=4)
    mask = _mask([6, 2, 0, 4], 6)  # row 2 is fully masked and must not count as a sequence
    loss[2] = float("nan")
    out = ca.agg_loss(loss, mask, mode)
    assert out.item() == pytest.approx(_agg_ref(loss, mask, mode), rel=1e-7, abs=1e-9)


def test_agg_loss_sum_norm_scale_and_global_denominators():
    loss, mask = _rand(3, 5, seed=5), _mask([5, 3, 1], 5)
    assert ca.agg_loss(loss, mask, "seq-mean-token-sum-norm", loss_scale_factor=2).item() == pytest.approx(
        _agg_ref(loss, mask, "seq-mean-token-sum-norm", scale=2), rel=1e-9
    )
    # two data-parallel ranks: with global denominators and x dp_size, the rank average is the full-batch value
    full_tok = _agg_ref(loss, mask, "token-mean")
    halves = [(loss[:2], mask[:2]), (loss[2:], mask[2:])]
    dp = [ca.agg_loss(l, m, "token-mean", dp_size=2, batch_num_tokens=mask.sum()) for l, m in halves]
    assert (sum(dp) / 2).item() == pytest.approx(full_tok, rel=1e-9)
    dp = [ca.agg_loss(l, m, "seq-mean-token-mean", dp_size=2, global_batch_size=3) for l, m in halves]
    assert (sum(dp) / 2).item() == pytest.approx(_agg_ref(loss, mask, "seq-mean-token-mean"), rel=1e-7)
    with pytest.raises(ValueError, match="batch_num_tokens"):
        ca.agg_loss(loss, mask, "token-mean", dp_size=2)
    with pytest.raises(ValueError, match="loss_agg_mode"):
        ca.agg_loss(loss, mask, "mean")


def test_agg_loss_all_masked_is_zero():
    assert ca.agg_loss(torch.ones(2, 3), torch.zeros(2, 3), "token-mean").item() == 0.0
    assert ca.agg_loss(torch.ones(2, 3), torch.zeros(2, 3), "seq-mean-token-mean").item() == 0.0


# ---------------------------------------------------------------- policy loss


def _ppo_ref(old, new, adv, mask, lo, hi, c):
    """Per-token dual-clip PPO loss and the three statistics, with Python floats."""
    B, T = adv.shape
    per, clip_n, low_n, kl_sum, n = [[0.0] * T for _ in range(B)], 0, 0, 0.0, 0
    for i in range(B):
        for t in range(T):
            lr = max(-20.0, min(20.0, float(new[i, t]) - float(old[i, t])))
            r, a = math.exp(lr), float(adv[i, t])
            l1 = -a * r
            l2 = -a * min(max(r, 1 - lo), 1 + hi)
            l = max(l1, l2)
            lower = False
            if a < 0 and l > -a * c:
                l, lower = -a * c, True
            per[i][t] = l
            if mask[i, t]:
                n += 1
                kl_sum += -lr
                clip_n += l2 > l1
                low_n += lower
    return per, clip_n / n, kl_sum / n, low_n / n


def _ppo_inputs(seed):
    B, T = 4, 8
    old = _rand(B, T, seed=seed) * 0.5 - 2
    new = old + _rand(B, T, seed=seed + 1) * 0.6
    new[0, 0] = old[0, 0] + math.log(5.0)  # ratio 5 with a negative advantage: dual clip must fire
    adv = _rand(B, T, seed=seed + 2)
    adv[0, 0] = -1.5
    return old, new, adv, _mask([8, 5, 8, 3], T)


@pytest.mark.parametrize("lo,hi", [(0.2, 0.2), (0.1, 0.28)])
def test_compute_policy_loss_plain_args(lo, hi):
    old, new, adv, mask = _ppo_inputs(10)
    loss, clipfrac, kl, clip_lower = ca.compute_policy_loss(
        old, new, adv, mask, cliprange=0.2, cliprange_low=lo, cliprange_high=hi, clip_ratio_c=3.0
    )
    per, ref_clip, ref_kl, ref_lower = _ppo_ref(old, new, adv, mask, lo, hi, 3.0)
    assert loss.item() == pytest.approx(_agg_ref(_t(per), mask, "token-mean"), rel=1e-7)
    assert clipfrac.item() == pytest.approx(ref_clip, rel=1e-7)
    assert kl.item() == pytest.approx(ref_kl, rel=1e-7)
    assert clip_lower.item() == pytest.approx(ref_lower, rel=1e-7)
    assert ref_lower > 0  # the dual clip was exercised


def test_clip_asymmetry_changes_which_tokens_clip():
    old = torch.zeros(1, 2, dtype=torch.float64)
    new = _t([[math.log(1.25), math.log(0.85)]])  # ratios 1.25 and 0.85
    adv = _t([[1.0, -1.0]])
    mask = torch.ones(1, 2, dtype=torch.float64)
    # symmetric 0.2, range [0.8, 1.2]: 1.25 with A>0 is clipped, 0.85 is inside
    _, cf_sym, _, _ = ca.compute_policy_loss(old, new, adv, mask, cliprange=0.2)
    # low 0.1 / high 0.3: 1.25 inside (no clip), 0.85 outside [0.9, 1.3] with A<0 (clipped)
    loss, cf_asym, _, _ = ca.compute_policy_loss(old, new, adv, mask, cliprange=0.2, cliprange_low=0.1,
                                                 cliprange_high=0.3)
    assert cf_sym.item() == pytest.approx(0.5) and cf_asym.item() == pytest.approx(0.5)
    assert loss.item() == pytest.approx((-1.25 + 0.9) / 2, rel=1e-9)


def test_vanilla_registered_loss_reads_config_and_global_info():
    old, new, adv, mask = _ppo_inputs(20)
    cfg = OmegaConf.create({"clip_ratio": 0.2, "clip_ratio_low": 0.15, "clip_ratio_high": 0.3, "clip_ratio_c": 2.5})
    loss, metrics = ca.compute_policy_loss_vanilla(old, new, adv, mask, loss_agg_mode="seq-mean-token-mean",
                                                   config=cfg)
    per, ref_clip, ref_kl, ref_lower = _ppo_ref(old, new, adv, mask, 0.15, 0.3, 2.5)
    assert loss.item() == pytest.approx(_agg_ref(_t(per), mask, "seq-mean-token-mean"), rel=1e-7)
    assert float(metrics["actor/pg_clipfrac"]) == pytest.approx(ref_clip, rel=1e-7)
    assert float(metrics["actor/ppo_kl"]) == pytest.approx(ref_kl, rel=1e-7)
    assert float(metrics["actor/pg_clipfrac_lower"]) == pytest.approx(ref_lower, rel=1e-7)

    # null low/high fall back to clip_ratio; global_batch_info feeds agg_loss; IS weights scale per token
    cfg2 = {"clip_ratio": 0.2, "clip_ratio_low": None, "clip_ratio_high": None,
            "global_batch_info": {"dp_size": 2, "batch_num_tokens": 48}}
    w = torch.full_like(adv, 0.5)
    loss2, _ = ca.compute_policy_loss_vanilla(old, new, adv, mask, "token-mean", cfg2, rollout_is_weights=w)
    per2, *_ = _ppo_ref(old, new, adv, mask, 0.2, 0.2, 3.0)
    ref2 = sum(0.5 * per2[i][t] * float(mask[i, t]) for i in range(4) for t in range(8)) / 48 * 2
    assert loss2.item() == pytest.approx(ref2, rel=1e-7)


def test_policy_loss_gradient_float32():
    old, new, adv, mask = _ppo_inputs(30)
    new32 = new.float().requires_grad_(True)
    loss, *_ = ca.compute_policy_loss(old.float(), new32, adv.float(), mask.float(), cliprange=0.2)
    loss.backward()
    new64 = new.clone().requires_grad_(True)
    ref, *_ = ca.compute_policy_loss(old, new64, adv, mask, cliprange=0.2)
    ref.backward()
    torch.testing.assert_close(new32.grad.double(), new64.grad, rtol=1e-5, atol=1e-6)
    assert torch.all(new32.grad[mask == 0] == 0)


def test_dual_clip_requires_c_above_one():
    old, new, adv, mask = _ppo_inputs(40)
    with pytest.raises(ValueError, match="clip_ratio_c"):
        ca.compute_policy_loss(old, new, adv, mask, cliprange=0.2, clip_ratio_c=1.0)


# ---------------------------------------------------------------- value loss, entropy, KL


def test_value_loss():
    vpreds, returns, values = _rand(3, 5, seed=50), _rand(3, 5, seed=51), _rand(3, 5, seed=52)
    mask = _mask([5, 2, 4], 5)
    c = 0.3
    loss, clipfrac = ca.compute_value_loss(vpreds, returns, values, mask, cliprange_value=c)
    per, n_clip = [[0.0] * 5 for _ in range(3)], 0
    for i in range(3):
        for t in range(5):
            v, r, v0 = float(vpreds[i, t]), float(returns[i, t]), float(values[i, t])
            vc = min(max(v, v0 - c), v0 + c)
            per[i][t] = max((v - r) ** 2, (vc - r) ** 2)
            n_clip += bool(mask[i, t]) and (vc - r) ** 2 > (v - r) ** 2
    assert loss.item() == pytest.approx(0.5 * _agg_ref(_t(per), mask, "token-mean"), rel=1e-7)
    assert clipfrac.item() == pytest.approx(n_clip / float(mask.sum()), rel=1e-7)
    loss_seq, _ = ca.compute_value_loss(vpreds, returns, values, mask, c, loss_agg_mode="seq-mean-token-sum-norm",
                                        loss_scale_factor=4)
    assert loss_seq.item() == pytest.approx(0.5 * _agg_ref(_t(per), mask, "seq-mean-token-sum-norm", 4), rel=1e-7)


def test_entropy_loss():
    logits = _rand(2, 3, 7, seed=60).float()
    mask = _mask([3, 1], 3)
    ents = []
    for i in range(2):
        row = []
        for t in range(3):
            p = torch.softmax(logits[i, t].double(), -1)
            row.append(-sum(float(x) * math.log(float(x)) for x in p))
        ents.append(row)
    assert ca.compute_entropy_loss(logits, mask).item() == pytest.approx(_agg_ref(_t(ents), mask, "token-mean"),
                                                                         rel=1e-5)


@pytest.mark.parametrize("name", ["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3"])
def test_kl_penalty_values(name):
    lp, ref = _rand(3, 4, seed=70), _rand(3, 4, seed=71)
    lp[0, 0], ref[0, 0] = 0.0, -30.0  # extreme gap: low_var_kl's clamps must engage
    out = ca.kl_penalty(lp, ref, name)
    for i in range(3):
        for t in range(4):
            d = float(lp[i, t]) - float(ref[i, t])
            if name in ("kl", "k1"):
                e = d
            elif name == "abs":
                e = abs(d)
            elif name in ("mse", "k2"):
                e = 0.5 * d * d
            else:
                x = max(-20.0, min(20.0, -d))
                e = max(-10.0, min(10.0, math.exp(x) - x - 1))
            assert out[i, t].item() == pytest.approx(e, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("name", ["k1+", "low_var_kl+", "k3+", "abs+"])
def test_kl_penalty_straight_through(name):
    lp = _rand(2, 3, seed=80).requires_grad_(True)
    ref = _rand(2, 3, seed=81)
    out = ca.kl_penalty(lp, ref, name)
    torch.testing.assert_close(out.detach(), ca.kl_penalty(lp.detach(), ref, name[:-1]), **TOL)
    out.sum().backward()
    torch.testing.assert_close(lp.grad, (lp - ref).detach(), **TOL)  # gradient of k2 = 0.5 d^2


def test_kl_penalty_unknown():
    with pytest.raises(ValueError, match="low_var_kl"):
        ca.kl_penalty(torch.zeros(1), torch.zeros(1), "full")


def test_compute_rewards():
    s, old, ref = _rand(2, 3, seed=90), _rand(2, 3, seed=91), _rand(2, 3, seed=92)
    torch.testing.assert_close(ca.compute_rewards(s, old, ref, 0.1), s - 0.1 * (old - ref), **TOL)
