"""GDPO (`algorithm.adv_estimator=gdpo`) through the stock command: the trainer hands the estimator the reward
function's per-sample components, and the advantages it trained on are the ones computed here from the samples it
wrote (`trainer.rollout_data_dir`): each component normalised within its prompt group, weighted, summed, whitened."""
import json

import numpy as np
from conftest import console_metrics, run_main_ppo
from test_quickstart import quickstart_command

REWARD = '''
import zlib


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    h = zlib.crc32(solution_str.encode())
    accuracy, fmt = (h % 100) / 100.0, float((h >> 8) % 2)
    return {"score": accuracy + fmt, "accuracy_reward": accuracy, "format_reward": fmt}
'''


def _expected_advantages(rows, weights):
    """Per row: each component normalised in its prompt's group (unbiased std + 1e-6), weighted sum, then whitened
    over all rows (every response is 16 tokens: ignore_eos); float64."""
    groups = {}
    for i, row in enumerate(rows):
        groups.setdefault(row["input"], []).append(i)
    total = np.zeros(len(rows))
    for key, weight in weights.items():
        values = np.array([r[key] for r in rows], dtype=np.float64)
        for members in groups.values():
            group = values[members]
            total[members] += weight * (group - group.mean()) / (group.std(ddof=1) + 1e-6)
    tokens = np.repeat(total, 16)
    return (total - tokens.mean()) / np.sqrt(tokens.var(ddof=1) + 1e-8)


def test_gdpo_trains_on_the_reward_components(gsm8k_data, gsm8k_model, tmp_path):
    (tmp_path / "reward.py").write_text(REWARD)
    overrides = quickstart_command(gsm8k_data, gsm8k_model, tmp_path / "ckpt") + [
        "algorithm.adv_estimator=gdpo", "actor_rollout_ref.rollout.n=4", "actor_rollout_ref.rollout.ignore_eos=True",
        "+algorithm.gdpo_reward_keys=[accuracy_reward,format_reward]", "+algorithm.gdpo_reward_weights=[1.0,0.5]",
        f"custom_reward_function.path={tmp_path / 'reward.py'}", f"trainer.rollout_data_dir={tmp_path / 'rollouts'}",
    ]
    proc, _ = run_main_ppo(overrides)
    assert proc.returncode == 0, proc.stderr[-3000:]
    steps = console_metrics(proc.stdout)
    for step in (1, 2):
        rows = [json.loads(line) for line in (tmp_path / "rollouts" / f"{step}.jsonl").read_text().splitlines()]
        expected = _expected_advantages(rows, {"accuracy_reward": 1.0, "format_reward": 0.5})
        metrics = steps[step]
        assert abs(metrics["critic/advantages/max"] - expected.max()) < 2e-3
        assert abs(metrics["critic/advantages/min"] - expected.min()) < 2e-3
        accuracy = [r["accuracy_reward"] for r in rows]
        assert abs(metrics["gdpo/accuracy_reward/mean"] - np.mean(accuracy)) < 1e-3
        assert "gdpo/format_reward/std" in metrics
