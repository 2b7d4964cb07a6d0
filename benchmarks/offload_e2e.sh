#!/usr/bin/env bash
# FSDP CPU offload end to end (issue 12): the stock main_ppo command at the field report's shape (batch 1,
# 256 + 256 tokens, every micro-batch 1) under the simulated p40, t4 and v100-16gb profiles on one GPU,
# each twice: with the field report's manual offload (param + optimizer offload for actor and critic,
# eager attention) and with the plan's own choices. One more p40 run adds the reference model (KL loss,
# ref param offload) and checkpoints at steps 2 and 4; then a fresh run resumes it from step 4 to 6.
# Prints one table and writes $OUT/offload_e2e.json (exit status, s/step, peak GPU and host memory).
#
#   source .device-pack/install.sh && OUT=$OUT bash benchmarks/offload_e2e.sh      # ~6 min on an H200
#
# By default the training runs share the GPU at once (their simulated memory caps add up to ~130 of
# the H200's 141 GiB), so their s/step is measured under that sharing; ONLY="p40_manual p40_auto"
# runs a subset (one at a time with PARALLEL=0) for undisturbed timings. Needs .gpu-assets/ as
# benchmarks/gpu_e2e.sh does (tok/ and gsm8k/).
set -uo pipefail
OUT="${OUT:-./gpu_out}"; mkdir -p "$OUT"
ASSETS="${ASSETS:-.gpu-assets}"
MODEL=/tmp/qwen05b-random
CKPT=/tmp/offload_e2e_ckpt          # not under $OUT: 0.5B actor + critic with optimizer state is ~12 GB
STEPS="${STEPS:-8}" RUN_TIMEOUT="${RUN_TIMEOUT:-330}" RESUME_TIMEOUT="${RESUME_TIMEOUT:-150}"
PARALLEL="${PARALLEL:-1}" ONLY="${ONLY:-}"
# Seven Ray clusters at once: keep each object store small (the default takes 30% of host RAM apiece).
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false RAY_DEFAULT_OBJECT_STORE_MEMORY_PROPORTION=0.03
[ -f "$MODEL/config.json" ] || python3 benchmarks/build_qwen_shaped.py "$MODEL" --tokenizer "$ASSETS/tok" || exit 1
rm -rf "$CKPT"

common=(data.train_files="$ASSETS/gsm8k/train.parquet" data.val_files="$ASSETS/gsm8k/test.parquet"
        actor_rollout_ref.model.path="$MODEL" critic.model.path="$MODEL"
        actor_rollout_ref.actor.optim.lr=1e-6 critic.optim.lr=1e-5 algorithm.kl_ctrl.kl_coef=0.001
        actor_rollout_ref.rollout.name=vllm actor_rollout_ref.rollout.tensor_model_parallel_size=1
        trainer.logger='[console,file]' trainer.val_before_train=False trainer.n_gpus_per_node=1
        trainer.nnodes=1 trainer.test_freq=-1 trainer.total_epochs=15
        data.train_batch_size=1 data.max_prompt_length=256 data.max_response_length=256
        data.filter_overlong_prompts=True actor_rollout_ref.actor.ppo_mini_batch_size=1
        actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1 actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1
        actor_rollout_ref.rollout.gpu_memory_utilization=0.3 actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1
        critic.ppo_mini_batch_size=1 critic.ppo_micro_batch_size_per_gpu=1)
no_ckpt=(trainer.save_freq=-1 trainer.resume_mode=disable)
manual=(actor_rollout_ref.actor.fsdp_config.param_offload=True actor_rollout_ref.actor.fsdp_config.optimizer_offload=True
        critic.fsdp.param_offload=True critic.fsdp.optimizer_offload=True
        actor_rollout_ref.model.attn_implementation=eager critic.model.attn_implementation=eager)
with_ref=(actor_rollout_ref.actor.use_kl_loss=True actor_rollout_ref.ref.fsdp_config.param_offload=True
          trainer.default_local_dir="$CKPT" trainer.max_actor_ckpt_to_keep=1 trainer.max_critic_ckpt_to_keep=1)

run() {  # name, seconds, overrides...
  local name=$1 secs=$2; shift 2
  VERL_FILE_LOGGER_PATH="$OUT/$name.jsonl" timeout "$secs" python3 -m verl.trainer.main_ppo "${common[@]}" "$@" \
    > "$OUT/$name.log" 2>&1
  echo $? > "$OUT/$name.rc"
}

wanted() { [ -z "$ONLY" ] || [[ " $ONLY " == *" $1 "* ]]; }

start() {  # name, seconds, overrides...: in the background (PARALLEL=1) or now
  wanted "$1" || return 0
  echo "start $1"
  if [ "$PARALLEL" = 1 ]; then run "$@" & pids+=($!); else run "$@"; fi
}
pids=()
wait_runs() { [ ${#pids[@]} -eq 0 ] || wait "${pids[@]}"; pids=(); }   # not the memory sampler

# The whole machine's host memory in use (MemTotal - MemAvailable), sampled every 2 s; its peak covers all
# runs together (each run's own peak is its workers' perf/cpu_memory_used_gb).
( peak=0; while :; do
    used=$(awk '/MemTotal/{t=$2} /MemAvailable/{a=$2} END{print t-a}' /proc/meminfo)
    [ "$used" -gt "$peak" ] && peak=$used && echo "$peak" > "$OUT/host_used_peak_kb"
    sleep 2; done ) &
sampler=$!

ckpt_then_resume() {  # 4 steps saving at 2 and 4, then a fresh run resumes from step 4 to step 6
  run p40_manual_ref_ckpt "$RUN_TIMEOUT" compat.device=p40 trainer.total_training_steps=4 "${manual[@]}" \
    "${with_ref[@]}" trainer.save_freq=2 trainer.resume_mode=disable
  run p40_manual_ref_resume "$RESUME_TIMEOUT" compat.device=p40 trainer.total_training_steps=6 "${manual[@]}" \
    "${with_ref[@]}" trainer.save_freq=-1 trainer.resume_mode=auto
}

t0=$(date +%s)
for dev in p40 t4 v100-16gb; do
  start "${dev}_manual" "$RUN_TIMEOUT" compat.device="$dev" trainer.total_training_steps="$STEPS" "${no_ckpt[@]}" "${manual[@]}"
done
if wanted p40_manual_ref_ckpt; then
  echo "start p40_manual_ref_ckpt, then p40_manual_ref_resume"
  if [ "$PARALLEL" = 1 ]; then ckpt_then_resume & pids+=($!); else ckpt_then_resume; fi
fi
[ "$PARALLEL" = 1 ] && sleep 15   # stagger the model loads (each holds a full host copy for a moment)
for dev in p40 t4 v100-16gb; do
  start "${dev}_auto" "$RUN_TIMEOUT" compat.device="$dev" trainer.total_training_steps="$STEPS" "${no_ckpt[@]}"
done
wait_runs
kill "$sampler" 2>/dev/null
echo "wall: $(( $(date +%s) - t0 )) s"

for rc in "$OUT"/*.rc; do
  name=$(basename "$rc" .rc)
  echo "--- $name: exit $(cat "$rc")"
  grep -E "Traceback|Error|Resuming from|Saved checkpoint|No checkpoint" "$OUT/$name.log" | grep -v "^\s*$" | tail -6
  [ -s "$OUT/$name.jsonl" ] && python3 benchmarks/summarize_run.py "$OUT/$name.jsonl" --name "$name" \
    --json "$OUT/$name.summary.json" > /dev/null
done
python3 benchmarks/offload_table.py "$OUT" --json "$OUT/offload_e2e.json"
