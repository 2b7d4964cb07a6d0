"""The estimators and policy losses upstream 0.9.1 users select by name (remax, opo, grpo_passk, gpg,
rloo_vectorized, grpo_vectorized; gspo, sapo, gpg, clip_cov, kl_cov, geo_mean, cispo; reinforce) against
float64 references written as plain Python loops from the papers' formulas.

Tolerance: float64 inputs, 1e-9 absolute and relative; 1e-7 relative where agg_loss's 1e-8 guard on
per-sequence token counts (seq-mean-token-mean) or GMPO's on lengths enters and the reference leaves it out. Gradients are checked where the formula is about
the gradient (GSPO's token form, CISPO's detached weight, Clip-Cov's cut tokens).
"""
import math

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from verl.trainer.ppo import core_algos as ca

TOL = dict(rtol=1e-9, atol=1e-9)
INDEX = np.array(["a", "a", "a", "b", "b", "c"], dtype=object)   # groups of 3, 2 and 1
SCORES = [1.0, 0.0, 0.5, 2.0, -1.0, 0.7]
LENGTHS = [4, 2, 3, 4, 1, 3]
COLS = 4


def _mask(lengths=LENGTHS, cols=COLS):
    m = torch.zeros(len(lengths), cols, dtype=torch.float64)
    for i, n in enumerate(lengths):
        m[i, :n] = 1
    return m


def _rewards(scores=SCORES, lengths=LENGTHS):
    """Outcome rewards: the score sits on each response's last token."""
    r = torch.zeros(len(scores), COLS, dtype=torch.float64)
    for i, (s, n) in enumerate(zip(scores, lengths)):
        r[i, n - 1] = s
    return r


def _groups(index=INDEX):
    out = {}
    for i, g in enumerate(index):
        out.setdefault(g, []).append(i)
    return out


def _std(values):
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def _per_row(values, mask):
    return torch.tensor([[values[i] * float(mask[i, j]) for j in range(mask.shape[1])] for i in range(len(values))],
                        dtype=torch.float64)


# ----------------------------------------------------------------------------------------- estimators

def test_rloo_vectorized_is_leave_one_out_and_zero_for_singletons():
    m = _mask()
    ref = []
    for i, g in enumerate(INDEX):
        others = [SCORES[j] for j in _groups()[g] if j != i]
        ref.append(SCORES[i] - sum(others) / len(others) if others else 0.0)
    adv, ret = ca.compute_rloo_vectorized_outcome_advantage(_rewards(), m, INDEX)
    torch.testing.assert_close(adv, _per_row(ref, m), **TOL)
    assert adv is ret or torch.equal(adv, ret)


@pytest.mark.parametrize("norm", [True, False])
def test_grpo_vectorized_equals_the_group_formula(norm):
    m = _mask()
    ref = []
    for i, g in enumerate(INDEX):
        group = [SCORES[j] for j in _groups()[g]]
        if len(group) == 1:
            ref.append(SCORES[i] / (1 + 1e-6) if norm else SCORES[i])   # no baseline: mean 0, std 1
            continue
        centred = SCORES[i] - sum(group) / len(group)
        ref.append(centred / (_std(group) + 1e-6) if norm else centred)
    adv, _ = ca.get_adv_estimator_fn("grpo_vectorized")(token_level_rewards=_rewards(), response_mask=m, index=INDEX,
                                                       config={"norm_adv_by_std_in_grpo": norm})
    torch.testing.assert_close(adv, _per_row(ref, m), **TOL)


def test_opo_baseline_is_the_length_weighted_group_mean():
    m = _mask()
    ref = []
    for i, g in enumerate(INDEX):
        rows = _groups()[g]
        base = (sum(LENGTHS[j] * SCORES[j] for j in rows) / sum(LENGTHS[j] for j in rows)) if len(rows) > 1 else 0.0
        ref.append(SCORES[i] - base)
    adv, _ = ca.compute_opo_outcome_advantage(_rewards(), m, INDEX)
    torch.testing.assert_close(adv, _per_row(ref, m), **TOL)


@pytest.mark.parametrize("norm", [True, False])
def test_grpo_passk_credits_only_the_best_response(norm):
    index = INDEX[:5]
    scores, lengths = SCORES[:5], LENGTHS[:5]
    m = _mask(lengths)
    ref = [0.0] * 5
    for rows in _groups(index).values():
        ordered = sorted(rows, key=lambda j: -scores[j])
        gap = scores[ordered[0]] - scores[ordered[1]]
        ref[ordered[0]] = gap / (_std([scores[j] for j in rows]) + 1e-6) if norm else gap
    adv, _ = ca.compute_grpo_passk_outcome_advantage(_rewards(scores, lengths), m, index,
                                                     config={"norm_adv_by_std_in_grpo": norm})
    torch.testing.assert_close(adv, _per_row(ref, m), **TOL)
    with pytest.raises(ValueError, match="at least 2 responses"):
        ca.compute_grpo_passk_outcome_advantage(_rewards(), _mask(), INDEX, config={})


def test_gpg_scales_centred_scores_by_the_nonzero_share():
    m = _mask()
    alpha = len(SCORES) / sum(1 for s in SCORES if s != 0)
    ref = []
    for i, g in enumerate(INDEX):
        rows = _groups()[g]
        mean = sum(SCORES[j] for j in rows) / len(rows) if len(rows) > 1 else 0.0
        ref.append(alpha * (SCORES[i] - mean) / 2.0)
    adv, _ = ca.compute_gpg_outcome_advantage(_rewards(), m, INDEX, f_norm=2.0)
    torch.testing.assert_close(adv, _per_row(ref, m), **TOL)


def test_remax_subtracts_the_greedy_reward_from_returns_to_go():
    m = _mask()
    rewards = torch.tensor([[0.1, 0.2, 0.3, 0.4]] * len(SCORES), dtype=torch.float64) * m
    baselines = torch.tensor([0.5, -0.5, 0.0, 1.0, 2.0, 0.25], dtype=torch.float64)
    ref_adv, ref_ret = [], []
    for i in range(len(SCORES)):
        row_adv, row_ret = [], []
        for t in range(COLS):
            togo = sum(float(rewards[i, k] * m[i, k]) for k in range(t, COLS))
            row_ret.append(togo)
            row_adv.append(togo - float(baselines[i]) * float(m[i, t]))
        ref_adv.append(row_adv)
        ref_ret.append(row_ret)
    adv, ret = ca.compute_remax_outcome_advantage(rewards, baselines, m)
    torch.testing.assert_close(adv, torch.tensor(ref_adv, dtype=torch.float64), **TOL)
    torch.testing.assert_close(ret, torch.tensor(ref_ret, dtype=torch.float64), **TOL)


# ----------------------------------------------------------------------------------------- losses

def _loss_inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(4, 5, generator=g, dtype=torch.float64) * 2
    new = (old + torch.randn(4, 5, generator=g, dtype=torch.float64) * 0.4).requires_grad_(True)
    adv = torch.randn(4, 5, generator=g, dtype=torch.float64)
    mask = _mask([5, 3, 4, 2], 5)
    return old, new, adv, mask


def _config(**policy_loss):
    return OmegaConf.create({"clip_ratio": 0.2, "clip_ratio_low": 0.2, "clip_ratio_high": 0.28, "clip_ratio_c": 3.0,
                             "tau_pos": 1.0, "tau_neg": 1.05, "policy_loss": policy_loss, "global_batch_info": {}})


def _token_mean(per_token, mask):
    rows, cols = mask.shape
    num = sum(per_token[i][j] for i in range(rows) for j in range(cols) if mask[i, j])
    return num / sum(1 for i in range(rows) for j in range(cols) if mask[i, j])


def _seq_mean_token_mean(per_token, mask):
    rows, cols = mask.shape
    seqs = [sum(per_token[i][j] for j in range(cols) if mask[i, j]) / sum(float(mask[i, j]) for j in range(cols))
            for i in range(rows)]
    return sum(seqs) / rows


def _f(x, i, j):
    return float(x[i, j].detach())


def test_gspo_uses_the_sequence_ratio_for_every_token():
    old, new, adv, mask = _loss_inputs()
    lo, hi = 0.2, 0.28
    per = []
    for i in range(4):
        n = int(mask[i].sum())
        s = math.exp(sum(_f(new, i, j) - _f(old, i, j) for j in range(n)) / n)
        per.append([max(-_f(adv, i, j) * s, -_f(adv, i, j) * min(max(s, 1 - lo), 1 + hi)) for j in range(5)])
    loss, metrics = ca.get_policy_loss_fn("gspo")(old, new, adv, mask, "seq-mean-token-mean", _config())
    assert loss.item() == pytest.approx(_seq_mean_token_mean(per, mask), rel=1e-7)
    assert set(metrics) == {"actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"}
    # token form: d loss / d log pi_t = -A_t * s_i / (len_i * rows) for an unclipped sequence
    loss.backward()
    for i in range(4):
        n = int(mask[i].sum())
        s = math.exp(sum(_f(new, i, j) - _f(old, i, j) for j in range(n)) / n)
        if 1 - lo < s < 1 + hi:
            for j in range(n):
                assert new.grad[i, j].item() == pytest.approx(-_f(adv, i, j) * s / (n * 4), rel=1e-7)


def test_sapo_gate_and_fixed_seq_mean_token_mean():
    old, new, adv, mask = _loss_inputs(1)
    per = []
    for i in range(4):
        row = []
        for j in range(5):
            tau = 1.0 if _f(adv, i, j) > 0 else 1.05
            r = math.exp(_f(new, i, j) - _f(old, i, j))
            row.append(-_f(adv, i, j) * (4 / tau) / (1 + math.exp(-tau * (r - 1))))
        per.append(row)
    loss, _ = ca.compute_policy_loss_sapo(old, new, adv, mask, "token-sum", _config())  # mode ignored, as upstream
    assert loss.item() == pytest.approx(_seq_mean_token_mean(per, mask), rel=1e-7)


def test_gpg_and_reinforce_are_plain_policy_gradients():
    old, new, adv, mask = _loss_inputs(2)
    per = [[-_f(adv, i, j) * _f(new, i, j) for j in range(5)] for i in range(4)]
    loss, metrics = ca.compute_policy_loss_gpg(old, new, adv, mask, "token-mean", _config())
    assert loss.item() == pytest.approx(_token_mean(per, mask), rel=1e-9) and metrics == {}
    loss, metrics = ca.compute_policy_loss_reinforce(old, new, adv, mask, "token-mean", _config())
    assert loss.item() == pytest.approx(_token_mean(per, mask), rel=1e-9)
    kl = _token_mean([[_f(old, i, j) - _f(new, i, j) for j in range(5)] for i in range(4)], mask)
    assert metrics["actor/ppo_kl"] == pytest.approx(kl, rel=1e-9)
    weights = torch.full_like(adv, 0.5)
    loss_w, _ = ca.compute_policy_loss_reinforce(old, new, adv, mask, "token-mean", _config(), weights)
    assert loss_w.item() == pytest.approx(0.5 * _token_mean(per, mask), rel=1e-9)


def test_cispo_detaches_the_clipped_weight():
    old, new, adv, mask = _loss_inputs(3)
    lo, hi = 0.2, 0.28
    weight = [[min(max(math.exp(_f(new, i, j) - _f(old, i, j)), 1 - lo), 1 + hi) for j in range(5)] for i in range(4)]
    per = [[-weight[i][j] * _f(adv, i, j) * _f(new, i, j) for j in range(5)] for i in range(4)]
    loss, _ = ca.compute_policy_loss_cispo(old, new, adv, mask, "token-mean", _config())
    assert loss.item() == pytest.approx(_token_mean(per, mask), rel=1e-9)
    loss.backward()
    n_tokens = float(mask.sum())
    for i in range(4):
        for j in range(5):   # gradient -w*A/N even where the ratio was clipped
            want = -weight[i][j] * _f(adv, i, j) / n_tokens if mask[i, j] else 0.0
            assert new.grad[i, j].item() == pytest.approx(want, rel=1e-9, abs=1e-12)


def _cov(adv, logp, mask):
    cells = [(i, j) for i in range(mask.shape[0]) for j in range(mask.shape[1]) if mask[i, j]]
    ma = sum(_f(adv, i, j) for i, j in cells) / len(cells)
    ml = sum(_f(logp, i, j) for i, j in cells) / len(cells)
    return {(i, j): (_f(adv, i, j) - ma) * (_f(logp, i, j) - ml) for i, j in cells}


def test_kl_cov_penalises_the_top_covariance_tokens():
    old, new, adv, mask = _loss_inputs(4)
    share, coef = 0.25, 0.3
    cov = _cov(adv, new.detach(), mask)
    k = max(1, int(len(cov) * share))
    top = set(sorted(cov, key=lambda c: -cov[c])[:k])
    per = [[-_f(adv, i, j) * math.exp(_f(new, i, j) - _f(old, i, j))
            + (coef * abs(_f(new, i, j) - _f(old, i, j)) if (i, j) in top else 0.0) for j in range(5)] for i in range(4)]
    loss, _ = ca.compute_policy_loss_kl_cov(old, new, adv, mask, "token-mean",
                                            _config(kl_cov_ratio=share, ppo_kl_coef=coef))
    assert loss.item() == pytest.approx(_token_mean(per, mask), rel=1e-9)


def test_clip_cov_removes_the_gradient_of_covariance_outliers():
    old, new, adv, mask = _loss_inputs(5)
    lo, hi = 0.2, 0.28
    cov = _cov(adv, new.detach(), mask)
    values = sorted(cov.values())
    lb, ub = values[len(values) // 3], values[-1] + 1.0    # a band that holds several tokens
    per, cut = [], set()
    for i in range(4):
        row = []
        for j in range(5):
            r = math.exp(_f(new, i, j) - _f(old, i, j))
            a = _f(adv, i, j)
            unclipped, clipped = -a * r, -a * min(max(r, 1 - lo), 1 + hi)
            candidate = mask[i, j] and not clipped > unclipped and lb < cov.get((i, j), -1e9) < ub
            if candidate:
                cut.add((i, j))
            row.append(0.0 if candidate else max(unclipped, clipped))
        per.append(row)
    assert cut   # the band selects tokens; a ratio of 1.0 cuts every candidate
    loss, metrics = ca.compute_policy_loss_clip_cov(old, new, adv, mask, "token-mean",
                                                    _config(clip_cov_ratio=1.0, clip_cov_lb=lb, clip_cov_ub=ub))
    assert loss.item() == pytest.approx(_token_mean(per, mask), rel=1e-9)
    assert metrics["actor/pg_clipfrac"] == pytest.approx(len(cut) / float(mask.sum()), rel=1e-9)
    loss.backward()
    assert all(new.grad[i, j].item() == 0.0 for i, j in cut)


def test_geo_mean_clips_log_ratios_pessimistically_and_averages_sequences():
    old, new, adv, mask = _loss_inputs(6)
    lo, hi = 0.2, 0.28
    per_seq = []
    for i in range(4):
        n = int(mask[i].sum())
        total, adv_sum = 0.0, 0.0
        for j in range(n):
            lr = _f(new, i, j) - _f(old, i, j)
            sign = (_f(adv, i, j) > 0) - (_f(adv, i, j) < 0)
            bounded = min(max(lr, -lo), hi)
            total += sign * min(sign * lr, sign * bounded)
            adv_sum += _f(adv, i, j)
        per_seq.append(-(adv_sum / n) * math.exp(total / n))
    loss, _ = ca.compute_policy_loss_geo_mean(old, new, adv, mask, "token-mean", _config())
    assert loss.item() == pytest.approx(sum(per_seq) / 4, rel=1e-7)
    # with data parallelism the global sequence count divides and dp_size undoes the gradient average
    cfg = _config()
    cfg.global_batch_info = {"dp_size": 2, "global_batch_size": 8}
    loss_dp, _ = ca.compute_policy_loss_geo_mean(old, new, adv, mask, "token-mean", cfg)
    assert loss_dp.item() == pytest.approx(sum(per_seq) / 8 * 2, rel=1e-7)
