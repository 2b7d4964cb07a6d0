#!/usr/bin/env bash
# The stock main_ppo command on a GPU: upstream's quick-start shape on the real device, then the field
# report's settings under the simulated P40 profile. Needs .gpu-assets/ (the Qwen tokenizer in tok/ and
# the GSM8K parquet files in gsm8k/, made by examples/data_preprocess/gsm8k.py). Results go to $OUT.
#   QS_STEPS=3 P40_STEPS=20 bash benchmarks/gpu_e2e.sh
set -uo pipefail
OUT="${OUT:-./gpu_out}"; mkdir -p "$OUT"
ASSETS="${ASSETS:-.gpu-assets}"
MODEL=/tmp/qwen05b-random
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
[ -f "$MODEL/config.json" ] || python3 benchmarks/build_qwen_shaped.py "$MODEL" --tokenizer "$ASSETS/tok" || exit 1

common=(data.train_files="$ASSETS/gsm8k/train.parquet" data.val_files="$ASSETS/gsm8k/test.parquet"
        actor_rollout_ref.model.path="$MODEL" critic.model.path="$MODEL"
        actor_rollout_ref.actor.optim.lr=1e-6 critic.optim.lr=1e-5 algorithm.kl_ctrl.kl_coef=0.001
        actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.tensor_model_parallel_size=1
        trainer.logger='[console,file]' trainer.val_before_train=False trainer.n_gpus_per_node=1
        trainer.nnodes=1 trainer.test_freq=10 trainer.total_epochs=15
        # timings only: no checkpoint writes, and no run resumes from another's checkpoint
        trainer.save_freq=-1 trainer.resume_mode=disable)

run() {  # name, seconds, overrides...
  local name=$1 secs=$2; shift 2
  VERL_FILE_LOGGER_PATH="$OUT/$name.jsonl" timeout "$secs" python3 -m verl.trainer.main_ppo "${common[@]}" "$@" \
    > "$OUT/$name.log" 2>&1
  echo "$name: exit $?"; grep -iE "warn|replac|plan|error" "$OUT/$name.log" | head -40
  python3 benchmarks/summarize_run.py "$OUT/$name.jsonl" --name "$name" --json "$OUT/$name.summary.json"
}

run h200_quickstart "${QS_TIMEOUT:-300}" data.train_batch_size=256 data.max_prompt_length=512 \
  data.max_response_length=512 actor_rollout_ref.actor.ppo_mini_batch_size=64 \
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8 \
  actor_rollout_ref.rollout.gpu_memory_utilization=0.4 actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4 \
  critic.ppo_micro_batch_size_per_gpu=4 trainer.total_training_steps="${QS_STEPS:-3}"

run p40_field_report "${P40_TIMEOUT:-240}" compat.device=p40 data.train_batch_size=1 data.max_prompt_length=256 \
  data.max_response_length=256 data.filter_overlong_prompts=True actor_rollout_ref.actor.ppo_mini_batch_size=1 \
  actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1 actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1 \
  actor_rollout_ref.rollout.gpu_memory_utilization=0.3 actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1 \
  critic.ppo_micro_batch_size_per_gpu=1 trainer.total_training_steps="${P40_STEPS:-20}"

# float16 (simulated T4): PPO with a critic and GRPO with a KL loss, the two runs that used to stop at the
# first compute_values / compute_ref_log_prob. Off unless FP16_STEPS is set, e.g. FP16_STEPS=3.
if [ "${FP16_STEPS:-0}" -gt 0 ]; then
  fp16=(compat.device=t4 data.train_batch_size=64 data.max_prompt_length=512 data.max_response_length=128
        actor_rollout_ref.actor.ppo_mini_batch_size=16 actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4
        actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4 actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4
        critic.ppo_micro_batch_size_per_gpu=4 trainer.total_training_steps="$FP16_STEPS")
  run t4_ppo_gae "${FP16_TIMEOUT:-300}" "${fp16[@]}"
  run t4_grpo_kl_loss "${FP16_TIMEOUT:-300}" "${fp16[@]}" algorithm.adv_estimator=grpo \
    actor_rollout_ref.actor.use_kl_loss=True actor_rollout_ref.rollout.n=4
fi
