"""Score a generated file offline: `python -m verl.trainer.main_eval data.path=... [custom_reward_function.path=...]`.

Upstream 0.9.1's entry point and `config/evaluation.yaml` keys. Each row of `data.path` holds a list
of responses (`data.response_key`), its data source (`data.data_source_key`) and a dict with the
ground truth (`data.reward_model_key`, key "ground_truth"). Every response is scored with the custom
reward function, or the built-in scorers when none is set; a row scores the mean over its responses,
and `test_score/<data source>` is the mean over that source's rows. Rows are scored in Ray tasks
(`ray_kwargs.ray_init`), a chunk of rows per task.
"""
from __future__ import annotations

import sys
from collections import defaultdict

ROWS_PER_TASK = 256


def _score(value) -> float:
    """A scorer's result as a number: a dict carries it under "score"."""
    if isinstance(value, dict):
        if "score" not in value:
            raise KeyError(f"the reward function returned a dict without 'score' (keys {sorted(value)})")
        value = value["score"]
    return float(value)


def score_rows(config, rows: list[tuple]) -> list[tuple[str, float]]:
    """(data source, mean score over the row's responses) for each (data source, responses, reward data)."""
    from verl.trainer.ppo.reward import get_custom_reward_fn
    from verl.utils.reward_score import default_compute_score

    fn = get_custom_reward_fn(config) or default_compute_score
    out = []
    for data_source, responses, reward_data in rows:
        ground_truth = reward_data["ground_truth"]
        scores = [_score(fn(data_source, response, ground_truth)) for response in responses]
        out.append((data_source, sum(scores) / len(scores) if scores else 0.0))
    return out


def read_rows(config) -> list[tuple]:
    """(data source, responses, reward data) per row of `data.path`; errors name the missing column."""
    import pandas as pd

    from verl.utils.fs import copy_to_local

    data = config.data
    path = copy_to_local(str(data.path), use_shm=bool(data.get("use_shm", False)))
    table = pd.read_parquet(path)
    keys = ("response_key", "data_source_key", "reward_model_key")
    missing = [f"data.{k}={data[k]!r}" for k in keys if data[k] not in table.columns]
    if missing:
        raise KeyError(f"{data.path} has no column for {', '.join(missing)}; its columns are {list(table.columns)}")
    columns = [table[data[k]].tolist() for k in keys]
    return [(str(src), list(responses), reward) for responses, src, reward in zip(*columns, strict=True)]


def evaluate(config) -> dict[str, float]:
    """{"test_score/<data source>": mean row score}."""
    import ray
    from omegaconf import OmegaConf

    rows = read_rows(config)
    started = not ray.is_initialized()
    if started:
        init = OmegaConf.to_container(config.ray_kwargs.get("ray_init", {}), resolve=True) or {}
        ray.init(**{k: v for k, v in init.items() if v is not None})
    try:
        task = ray.remote(score_rows)
        chunks = [rows[i:i + ROWS_PER_TASK] for i in range(0, len(rows), ROWS_PER_TASK)]
        results = ray.get([task.remote(config, chunk) for chunk in chunks])
    finally:
        if started:
            ray.shutdown()
    by_source = defaultdict(list)
    for data_source, score in (item for chunk in results for item in chunk):
        by_source[data_source].append(score)
    return {f"test_score/{src}": sum(s) / len(s) for src, s in by_source.items()}


def _task(config) -> None:
    try:
        metrics = evaluate(config)
    except (KeyError, FileNotFoundError, AttributeError, RuntimeError) as error:
        print(f"verl: main_eval: {error.args[0] if error.args else error}", file=sys.stderr)
        raise SystemExit(2) from None
    print(metrics, flush=True)


def main() -> None:
    import hydra

    hydra.main(config_path="config", config_name="evaluation", version_base=None)(_task)()


if __name__ == "__main__":
    main()
