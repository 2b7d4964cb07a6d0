#!/usr/bin/env bash
# The demo (README command (a)): train a tiny model from scratch with the stock PPO command and watch
# its score rise. Builds everything locally (model, tokenizer, data); runs on whatever device is here.
#
#   bash scripts/demo.sh            # a few minutes on a 2-core CPU
#   VERL_DEMO_DIR=/tmp/demo bash scripts/demo.sh trainer.total_epochs=5   # extra args = Hydra overrides
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
bash scripts/setup_env.sh
# shellcheck disable=SC1091
source "${VERL_VENV:-$ROOT/.venv}/bin/activate"

WORK="${VERL_DEMO_DIR:-$ROOT/outputs/demo}"
rm -rf "$WORK"
echo "[demo] building a tiny Qwen2 model and the task in $WORK"
python examples/demo/make_task.py "$WORK" >/dev/null

export VERL_FILE_LOGGER_PATH="$WORK/metrics.jsonl"
export TOKENIZERS_PARALLELISM=false
echo "[demo] training (the stock command; metrics also go to $VERL_FILE_LOGGER_PATH)"
python -m verl.trainer.main_ppo \
    data.train_files="$WORK/data/train.parquet" \
    data.val_files="$WORK/data/test.parquet" \
    data.train_batch_size=32 \
    data.max_prompt_length=48 \
    data.max_response_length=8 \
    data.dataloader_num_workers=0 \
    actor_rollout_ref.model.path="$WORK/model" \
    actor_rollout_ref.actor.optim.lr=1e-2 \
    actor_rollout_ref.actor.ppo_mini_batch_size=16 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.4 \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=32 \
    critic.optim.lr=1e-2 \
    critic.model.path="$WORK/model" \
    critic.ppo_micro_batch_size_per_gpu=16 \
    algorithm.kl_ctrl.kl_coef=0.001 \
    custom_reward_function.path=examples/demo/reward.py \
    trainer.logger='[console,file]' \
    trainer.project_name=verl_demo \
    trainer.experiment_name=repeat_digit \
    trainer.val_before_train=True \
    trainer.n_gpus_per_node=1 \
    trainer.nnodes=1 \
    trainer.save_freq=-1 \
    trainer.default_local_dir="$WORK/checkpoints" \
    trainer.test_freq=10 \
    trainer.total_epochs=5 \
    "$@" 2>&1 | tee "$WORK/train.log"

echo
echo "[demo] learning curve (critic/score/mean = mean reward of the step's sampled answers):"
python examples/demo/show_scores.py "$VERL_FILE_LOGGER_PATH"
