"""Generate responses for a data set of chat prompts: `python -m verl.trainer.main_generation_server`.

Upstream 0.9.1's entry point and keys: the `ppo_trainer` config, prompts from `data.train_files`
(column `data.prompt_key`, chat messages), `actor_rollout_ref.rollout.n` samples per prompt with its
`temperature` / `top_p` / `top_k` and `response_length`, written with every input column plus
`responses` (a list of `n` strings per row) to `data.output_path` (add it with `+data.output_path=...`).

Upstream starts its rollout servers and posts chat requests to them. Here the rollout engine the compat
plan picks (vLLM or the built-in one) runs in rollout workers, one per device
(`trainer.n_gpus_per_node` x `trainer.nnodes`), with the actor's dtype, attention and memory settings
from the same plan as training; prompts go through them `data.train_batch_size` at a time, the batch
the plan sized.
"""
from __future__ import annotations

import os
import sys

from verl.trainer.config_check import ConfigError, check_overrides, normalize

CONFIG_ERROR_EXIT = 2


def sampling_problems(config) -> list[str]:
    """What keeps the config from generating (each naming its key)."""
    rollout = config.actor_rollout_ref.rollout
    problems = []
    if not config.data.get("output_path"):
        problems.append("data.output_path is not set: add +data.output_path=/path/to/output.parquet")
    if int(rollout.n) < 1:
        problems.append(f"actor_rollout_ref.rollout.n={rollout.n}: draw at least one sample per prompt")
    if float(rollout.temperature) == 0.0 and int(rollout.n) != 1:
        problems.append("actor_rollout_ref.rollout.temperature=0 is greedy, so every sample would be the same: "
                        "set actor_rollout_ref.rollout.n=1")
    return problems


def prompt_batches(config, tokenizer):
    """The prompt table (pandas) and, per `data.train_batch_size` rows, the tokenised prompts (a DataProto)."""
    import pandas as pd

    from verl.protocol import DataProto
    from verl.utils.dataset.rl_dataset import RLHFDataset, collate_fn

    files = config.data.train_files
    files = [files] if isinstance(files, str) else list(files)
    table = pd.concat([pd.read_parquet(os.path.expanduser(f)) for f in files], ignore_index=True)
    data_cfg = dict(config.data, filter_overlong_prompts=False)
    dataset = RLHFDataset(files, tokenizer, data_cfg)
    keep = ("input_ids", "attention_mask", "position_ids", "raw_prompt_ids")
    size = int(config.data.train_batch_size)

    def batches():
        for start in range(0, len(dataset), size):
            rows = [dataset[i] for i in range(start, min(start + size, len(dataset)))]
            rows = [{k: row[k] for k in keep} for row in rows]
            yield DataProto.from_single_dict(collate_fn(rows))

    return table, batches()


def generate(config, plan):
    """The prompt table and `rollout.n` decoded responses per row of it, in row order."""
    import ray

    from verl.protocol import pad_dataproto_to_divisor, unpad_dataproto
    from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup
    from verl.workers.model_building.loading import load_tokenizer
    from verl.workers.fsdp_workers import ActorRolloutRefWorker

    model = config.actor_rollout_ref.model
    tokenizer = load_tokenizer(model.get("tokenizer_path") or model.path, bool(model.get("trust_remote_code", False)))
    table, batches = prompt_batches(config, tokenizer)
    pool = RayResourcePool([config.trainer.n_gpus_per_node] * config.trainer.nnodes,
                           use_gpu=plan.device_type != "cpu", max_colocate_count=1)
    workers = RayWorkerGroup(resource_pool=pool, ray_cls_with_init=RayClassWithInitArgs(
        cls=ray.remote(ActorRolloutRefWorker), config=config.actor_rollout_ref, role="rollout", plan=plan))
    workers.init_model()
    n = int(config.actor_rollout_ref.rollout.n)
    meta = {"eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id,
            "do_sample": float(config.actor_rollout_ref.rollout.temperature) > 0, "recompute_log_prob": False}
    responses: list[list[str]] = []
    for prompts in batches:
        prompts = prompts.repeat(repeat_times=n, interleave=True)
        prompts.meta_info.update(meta)
        padded, pad_size = pad_dataproto_to_divisor(prompts, workers.world_size)
        output = unpad_dataproto(workers.generate_sequences(padded), pad_size=pad_size)
        texts = decode_responses(output, tokenizer)
        responses += [texts[i:i + n] for i in range(0, len(texts), n)]
    if len(responses) != len(table):
        raise RuntimeError(f"generated for {len(responses)} prompts, the data has {len(table)} rows")
    return table, responses


def decode_responses(output, tokenizer) -> list[str]:
    """Each response's real tokens as text, special tokens (EOS) left out."""
    responses = output.batch["responses"]
    prompt_len = output.batch["prompts"].shape[-1] if "prompts" in output.batch.keys() else \
        output.batch["input_ids"].shape[-1] - responses.shape[-1]
    valid = output.batch["attention_mask"][:, prompt_len:].sum(-1).tolist()
    return [tokenizer.decode(responses[i, :valid[i]], skip_special_tokens=True) for i in range(len(valid))]


def run_generation(config) -> str:
    """Plan, start Ray, generate and write `data.output_path`; returns that path."""
    import ray

    from verl import compat
    from verl.trainer.ppo.task_runner import _init_ray, _resolve_by

    problems = sampling_problems(config)
    if problems:
        raise ConfigError("\n".join(f"- {p}" for p in problems))
    plan = compat.build_plan(config)
    print(compat.format_plan(plan), flush=True)
    _resolve_by(config, plan)
    _init_ray(config)
    try:
        table, responses = generate(config, plan)
    finally:
        ray.shutdown()
    table["responses"] = responses
    out = os.path.expanduser(str(config.data.output_path))
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    table.to_parquet(out)
    print(f"Saved {len(table)} prompts x {config.actor_rollout_ref.rollout.n} responses to {out}", flush=True)
    return out


def _task(config) -> None:
    try:
        normalize(config)
        run_generation(config)
    except ConfigError as error:
        print(f"verl: config error:\n{error}", file=sys.stderr)
        raise SystemExit(CONFIG_ERROR_EXIT) from None


def main() -> None:
    """Check the overrides, then let Hydra compose `config/ppo_trainer.yaml` and generate."""
    try:
        args, warnings = check_overrides(sys.argv[1:])
    except ConfigError as error:
        print(f"verl: config error:\n{error}", file=sys.stderr)
        raise SystemExit(CONFIG_ERROR_EXIT) from None
    for warning in warnings:
        print(f"verl: warning: {warning}", file=sys.stderr)
    from verl.trainer.main_ppo import unique_run_dir

    sys.argv[1:] = unique_run_dir(args)
    import hydra

    hydra.main(config_path="config", config_name="ppo_trainer", version_base=None)(_task)()


if __name__ == "__main__":
    main()
