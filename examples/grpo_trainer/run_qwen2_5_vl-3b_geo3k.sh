#!/usr/bin/env bash
# GRPO on Geometry3K with Qwen2.5-VL-3B-Instruct (upstream's VL recipe, one GPU): images in the rows, the
# model's processor beside the tokenizer. Hardware keys are left to the compat plan. Extra arguments are
# Hydra overrides (e.g. compat.device=p40 to plan for a simulated P40).
#   python3 examples/data_preprocess/geo3k.py --local_save_dir ~/data/geo3k   # first
set -euo pipefail
DATA="${DATA:-$HOME/data/geo3k}"
MODEL="${MODEL:-Qwen/Qwen2.5-VL-3B-Instruct}"
PYTHONUNBUFFERED=1 python3 -m verl.trainer.main_ppo \
    algorithm.adv_estimator=grpo \
    data.train_files="$DATA/train.parquet" \
    data.val_files="$DATA/test.parquet" \
    data.train_batch_size=64 \
    data.max_prompt_length=1024 \
    data.max_response_length=1024 \
    data.filter_overlong_prompts=True \
    data.truncation=error \
    data.image_key=images \
    actor_rollout_ref.model.path="$MODEL" \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.actor.ppo_mini_batch_size=32 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=auto \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=auto \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=auto \
    actor_rollout_ref.actor.use_kl_loss=True \
    actor_rollout_ref.actor.kl_loss_coef=0.01 \
    actor_rollout_ref.actor.kl_loss_type=low_var_kl \
    actor_rollout_ref.actor.entropy_coeff=0 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.n=5 \
    algorithm.use_kl_in_reward=False \
    trainer.logger=console \
    trainer.val_before_train=False \
    trainer.n_gpus_per_node=1 \
    trainer.nnodes=1 \
    trainer.save_freq=-1 \
    trainer.test_freq=5 \
    trainer.total_epochs=15 \
    "$@"
