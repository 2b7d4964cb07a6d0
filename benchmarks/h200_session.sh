#!/usr/bin/env bash
# The lead's H200 calls, as run for the docs' tables (one device call each, ~9 min):
#   source .device-pack/install.sh && bash benchmarks/h200_session.sh correctness   # rollout speed, GPU tests,
#                                                        # then the profile matrix and fp16 offload runs side by side
#   source .device-pack/install.sh && bash benchmarks/h200_session.sh speed         # the speed rows, one at a time
#   source .device-pack/install.sh && bash benchmarks/h200_session.sh profile       # profile_step alone, then the
#                                                        # memory model against the real workers, cases side by side
#   source .device-pack/install.sh && bash benchmarks/h200_session.sh variants      # the quick start's forward and
#                                                        # backward passes under other budgets/checkpointing (~5 min)
#   ... speed2   update_actor profiled, then the quick-start and GRPO rows (~5.5 min)
#   ... final2   the whole matrix (3 steps, two validations), then the p40 and quick-start rows (~7.5 min)
#   ... next     generate/log-prob profiled, the offload fix's GPU test, then the t4/v100 matrix cells (~4 min)
#   ... decode   the rollout GPU tests, then compiled vs eager decode (rollout_speed h200,h200_eager; ~3 min)
#   ... reshard  the updates with reshard_after_forward as planned vs upstream's true, then the memory model's
#                update phases with the kept copy on h200 and p40 (~6 min)
#   ... compile  the quick start's scoring and update phases with torch.compile off vs on (decoder layers and
#                log-prob chunks compiled): s per phase, and each phase's first call (the compile) (~6 min)
#   ... speed3   quick-start and GRPO rows (compiled decode/layers, kept gathers), then a compile A/B (~9.5 min)
#   ... final3   the whole matrix on the compiled code (~9.5 min; its last cell did not finish in one call)
#   ... matrix_a / matrix_b   the matrix in two calls: p40, p100, v100-16gb, t4 / rtx3090, a100-40gb, h200
#   ... speed4   the windowed decode's GPU tests, the GRPO row, decode speed on short and full prompts (~5 min)
#   ... long_p40 the 200-step field-report run under p40 (validation every 50, checkpoints at 100 and 200; ~7 min)
#   ... speed5   TRL's GRPOTrainer row (after `bash benchmarks/pack_trl.sh`), then the quick-start row (~9 min)
#   ... speed6   offload GPU tests, GRPO row, p40 field report with optimizer offload, quick-start row (~9.5 min)
#   ... speed7   offload GPU test, memory growth per step (h200 GRPO, p40 field), p40 with offload, update profile
#   ... long_p40b long_p40 with memory_growth.py beside it;  final4: rollout GPU tests, p40 8 steps, TRL row
#   ... next8    GPU tests of the SDPA mask / warm-up stream / pinned offload, GRPO and quick-start rows (~9.5 min)
#   ... next9    torch_varlen's GPU tests, then the quick-start and GRPO rows with packed micro-batches (~5 min)
#   ... final5   the built-in engine's speed rows (rollout_speed.py --skip-old; ~3 min)
#   ... matrix_c the rtx3090 and a100-40gb matrix cells (torch_varlen, packed) alone (~4 min)
#   ... next10   unwrapped one-device models: GPU tests, the p40 field report's peak breakdown, p40 and GRPO rows
#   ... next11   the p40 row (sparse tied-embedding gradients), then matrix_a's cells with the breakdown beside them
#   ... next12   matrix_c's cells (rtx3090, a100-40gb) beside the peak breakdown of the t4 matrix cell (PPO)
#   ... long_p40c the field report under p40 for 120 steps on the unwrapped plan, checkpoints, then resumed (~8 min)
#   ... long_p40d the field report under p40 for 200 steps (input embedding rows into .grad), validation at 100 and
#                200, a checkpoint at 200 (~7 min)
#   ... next13   GPU tests, the p40 cold start twice (no prestarted Ray workers), the p40 field report (input embedding
#                rows straight into .grad), then the pre-Ampere matrix cells (~8 min)
#   ... cold2    the p40 cold start twice (plan beside ray.init, no prestarted Ray workers), once more with every
#                process's stacks sampled, and transformers' import times (~4 min)
#   ... next14   the simulated devices' cuBLAS workspace size: its GPU test, then the p40 field report (8 steps) with
#                pre-Hopper workspaces (the plan's) beside H200-sized ones (CUBLAS_WORKSPACE_CONFIG=:4096:8), then the
#                sm_80 matrix cells (rtx3090, a100-40gb) on the code that keeps wrapped models' embedding as is (~8 min)
#   ... pycprobe whether this machine's Python caches bytecode (flags, .pyc beside the sources, writable?), the
#                torch+transformers import and the p40 cold start as the machine is, then with a writable bytecode
#                cache (PYTHONPYCACHEPREFIX, filled by the first run), once more stack-sampled (~5 min)
#   ... final6   the p40 cold start 3 times as the machine is (PYTHONDONTWRITEBYTECODE=1: the entry point now caches
#                bytecode itself, run 1 fills the cache), then the p40, quick-start and GRPO rows one at a time (~9 min)
#   ... cold3    the p40 cold start twice on the stock command (run 1 fills the bytecode cache), on the code whose
#                workers import the model code during the data wait (~2 min)
#   ... cold4    the p40 cold start 4 times (run 1 fills the bytecode cache), once more stack-sampled, then the GPU
#                tests of tests/workers and tests/utils: Ray started beside the plan, scikit-learn deferred (~5 min)
#   ... ab5      the p40 cold start, session 21's tree against this one alternately on one machine, 4 runs each
#                (run 0 fills each bytecode cache): median stages of runs 1-3 (~6 min)
#   ... ab6      the p40 cold start, session 22's tree against this one alternately on one machine, 4 runs each,
#                then one stack-sampled run and the GPU tests of tests/workers, utils, rollout (~7 min)
#   ... final8   the rollout GPU tests, the p40 row (8 steps), then ab6's comparison once more (~8 min)
#   ... ab7      ab6's comparison on the final tree, then the GPU tests of tests/compat (~5 min)
#   ... final7   every GPU-marked test, then the p40 row (8 steps) and the quick-start row (3 steps) (~9 min)
#   ... qs6      the quick-start row alone, 6 steps (its MFU settles after the first shapes compile) (~4 min)
#   ... rayprobe Ray's own start with the bytecode cache (ray_init_probe's variants), then the p40 cold start
#                with and without Ray's dashboard, alternated (~5 min)
#   ... gpu_tests every GPU-marked test (tests/compat, utils, workers, rollout) on the final code (~4 min)
#   ... coldprobe where cold start goes on this machine: torch/CUDA/transformers import and init in a fresh process,
#                Ray's own start under lean settings, then the p40 cold start with every process's stacks sampled
#                (benchmarks/stack_sampler), and the GPU tests (~6 min)
# Everything lands in /tmp/h200 and is packed into $OUT/<mode>.tgz (the device tool returns at most 8 files).
set -uo pipefail
mode=${1:?correctness, final, speed, profile, variants, speed2, final2, next, decode, reshard, compile, speed3, final3, matrix_a, matrix_b, speed4, long_p40, speed5, speed6, speed7, long_p40b, final4, next8, next8a, next9, final5, matrix_c, matrix_d, next10, next11, next12 long_p40c, coldprobe, cold2, next13, long_p40d, next14, pycprobe, final6, gpu_tests, cold3, cold4, ab5, ab6, final8, ab7, final7, qs6 or rayprobe}
W=/tmp/h200/$mode; mkdir -p "$W"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false RAY_DEFAULT_OBJECT_STORE_MEMORY_PROPORTION=0.03
MODEL=/tmp/qwen05b-random
[ -f $MODEL/config.json ] || python3 benchmarks/build_qwen_shaped.py $MODEL --tokenizer .gpu-assets/tok > "$W/build.log" 2>&1
pack() { tar czf "${OUT:-/tmp}/$mode.tgz" -C /tmp/h200 "$mode"; }
# One speed.py row into $W/<out>, within <seconds> of wall time: its exit, its table and its run summary
# (skipped updates included). `SPEED_EXTRA=... row ...` passes more overrides.
row() {
  local out=$1 name=$2 steps=$3 secs=$4 key
  case $name in quickstart) key=QS ;; *) key=$(echo "$name" | tr '[:lower:]' '[:upper:]') ;; esac
  env SPEED_ROWS="$name" "${key}_STEPS=$steps" "${key}_TIMEOUT=$(( secs - 10 ))" timeout "$secs" \
      python3 benchmarks/speed.py --out "$W/$out" > "$W/$out.log" 2>&1
  echo "$out exit $? at $(( $(date +%s) - t0 )) s"; tail -8 "$W/$out.log"
  [ -f "$W/$out/$name.jsonl" ] && python3 benchmarks/summarize_run.py "$W/$out/$name.jsonl" 2>&1 | tail -4
}
left() { echo $(( $1 - ($(date +%s) - t0) )); }   # seconds left of a call's <wall>
# A run's allocator peak per phase, one list over its steps (perf/max_memory_allocated_gb/<phase>).
phase_peaks() {
  python3 - "$1" <<'PY'
import json, sys
rows = [json.loads(l)["data"] for l in open(sys.argv[1]) if l.strip()]
rows = [r for r in rows if "timing_s/step" in r]
for phase in ("gen", "old_log_prob", "values", "update_critic", "update_actor"):
    print(phase, [round(r.get(f"perf/max_memory_allocated_gb/{phase}", 0), 3) for r in rows])
PY
}
# The field report under p40 for <steps> steps within <seconds>: validation on 256 test prompts every <test_freq>,
# checkpoints every <save_freq> in /tmp/ckpt_p40 (X keeps these overrides for a resume), then per-phase peaks over
# steps 2+ (flat, no crash), validation peaks and whether every grad norm was finite.
long_p40() {
  local steps=$1 test_freq=$2 save_freq=$3 secs=$4
  X="trainer.test_freq=$test_freq data.val_max_samples=256 trainer.save_freq=$save_freq trainer.default_local_dir=/tmp/ckpt_p40"
  SPEED_EXTRA="$X" SPEED_ROWS=p40 P40_STEPS=$steps P40_TIMEOUT=$(( secs - 10 )) timeout "$secs" python3 benchmarks/speed.py \
      --out "$W/p40" > "$W/p40.log" 2>&1
  echo "p40 $steps steps exit $? at $(( $(date +%s) - t0 )) s"; tail -4 "$W/p40.log"
  python3 benchmarks/summarize_run.py "$W/p40/p40.jsonl" 2>&1 | tail -4; ls /tmp/ckpt_p40 2>&1 | head
  python3 - "$W/p40/p40.jsonl" <<'PY'
import json, math, sys
steps = [r for r in (json.loads(l)["data"] for l in open(sys.argv[1]) if l.strip()) if "timing_s/step" in r]
print("steps", len(steps))
for phase in ("gen", "old_log_prob", "values", "update_critic", "update_actor"):
    vals = [r[f"perf/max_memory_allocated_gb/{phase}"] for r in steps[1:] if f"perf/max_memory_allocated_gb/{phase}" in r]
    print(phase, "steps 2+ min", round(min(vals), 4), "max", round(max(vals), 4), "| every 20th", [round(v, 3) for v in vals[::20]])
print("validation peaks", [(r["training/global_step"], round(r["perf/max_memory_allocated_gb/validation"], 3))
                           for r in steps if "perf/max_memory_allocated_gb/validation" in r])
print("grad norms finite:", all(math.isfinite(r.get(k, 0.0)) for r in steps for k in ("actor/grad_norm", "critic/grad_norm")))
PY
}
# The p40 cold start <repeat> times as is, then once with every process's stacks sampled into $W/stacks.
cold_starts() {
  local cs="--shapes field --assets .gpu-assets"
  timeout 150 python3 benchmarks/cold_start.py $cs --repeat "$1" --out "$W/cold_plain" > "$W/cold_plain.log" 2>&1
  echo "cold_start plain exit $?"; grep -E "run [0-9]/|^\| " "$W/cold_plain.log" | head -40
  VERL_STACK_SAMPLES="$W/stacks" VERL_STACK_SECONDS=50 PYTHONPATH="$PWD/benchmarks/stack_sampler:$PYTHONPATH" \
      timeout 120 python3 benchmarks/cold_start.py $cs --repeat 1 --out "$W/cold_sampled" > "$W/cold_sampled.log" 2>&1
  echo "cold_start sampled exit $?"; grep -E "run 1/" "$W/cold_sampled.log"
}
# The p40 cold start of .gpu-assets/ab_old (an older tree: `git archive <rev> verl benchmarks`) and of this tree,
# alternately on this machine, 4 runs each (run 0 of each fills its caches), each within <run seconds>, none
# started with less than 45 s left of <wall>; then the median stages of runs 1-3 (labels name the two trees).
ab_runs() {
  local run_s=$1 wall=$2 old_label=$3 cs="--shapes field --assets $PWD/.gpu-assets"
  for i in 0 1 2 3; do
    for side in old new; do
      [ "$(left "$wall")" -lt 45 ] && break 2
      dir=$PWD; [ $side = old ] && dir=$PWD/.gpu-assets/ab_old
      (cd "$dir" && timeout "$run_s" python3 benchmarks/cold_start.py $cs --repeat 1 --out "$W/${side}_$i" > "$W/${side}_$i.log" 2>&1)
      echo "$side $i: $(grep -E 'run 1/' "$W/${side}_$i.log") at $(( $(date +%s) - t0 )) s"
    done
  done
  python3 benchmarks/ab_table.py "$W" old new "$old_label" "this tree"
}
OPT_OFFLOAD="actor_rollout_ref.actor.fsdp_config.optimizer_offload=True critic.fsdp.optimizer_offload=True"
trap pack EXIT
trap 'exit 143' TERM
t0=$(date +%s)
if [ "$mode" = next14 ]; then
  timeout 100 python3 -m pytest -q -s -m gpu tests/compat/test_apply.py -k cublas > "$W/ws_test.log" 2>&1
  echo "workspace test exit $?"; grep -E "cuBLAS|passed|failed|Error" "$W/ws_test.log" | cut -c1-300
  row p40 p40 8 140 > "$W/p40.out" 2>&1 &
  a=$!
  CUBLAS_WORKSPACE_CONFIG=:4096:8 row p40_ws32 p40 8 140 > "$W/p40_ws32.out" 2>&1 &
  b=$!
  wait $a $b
  for r in p40 p40_ws32; do echo "== $r"; cat "$W/$r.out"; phase_peaks "$W/$r/p40.jsonl"; done
  timeout "$(left 575)" python3 benchmarks/gpu_matrix.py --assets .gpu-assets --profiles rtx3090,a100-40gb --steps 3 \
      --test-freq 2 --jobs 4 --budget-gb 112 --cell-timeout "$(( $(left 575) - 15 ))" --out "$W/matrix" > "$W/matrix.log" 2>&1
  echo "matrix exit $? at $(( $(date +%s) - t0 )) s"; grep -E "exit|^\|" "$W/matrix.log" | tail -14
elif [ "$mode" = cold3 ]; then
  timeout 110 python3 benchmarks/cold_start.py --shapes field --assets .gpu-assets --repeat 2 --out "$W/cold" \
      > "$W/cold.log" 2>&1
  echo "cold start exit $? at $(( $(date +%s) - t0 )) s"; grep -E "run [0-9]/|^\| " "$W/cold.log" | head -40
elif [ "$mode" = cold4 ]; then
  timeout 150 python3 benchmarks/cold_start.py --shapes field --assets .gpu-assets --repeat 4 --out "$W/cold" \
      > "$W/cold.log" 2>&1
  echo "cold start exit $? at $(( $(date +%s) - t0 )) s"; grep -E "run [0-9]/|^\| " "$W/cold.log" | head -44
  VERL_STACK_SAMPLES="$W/stacks" VERL_STACK_SECONDS=40 PYTHONPATH="$PWD/benchmarks/stack_sampler:$PYTHONPATH" \
      timeout 70 python3 benchmarks/cold_start.py --shapes field --assets .gpu-assets --repeat 1 --out "$W/cold_sampled" \
      > "$W/cold_sampled.log" 2>&1
  echo "cold start sampled exit $? at $(( $(date +%s) - t0 )) s"; grep -E "run 1/" "$W/cold_sampled.log"
  timeout 200 python3 -m pytest -q -rs -m gpu tests/workers tests/utils > "$W/gpu_tests.log" 2>&1
  echo "gpu tests exit $? at $(( $(date +%s) - t0 )) s"; grep -E "passed|failed|SKIPPED|Error" "$W/gpu_tests.log" | tail -8 | cut -c1-300
elif [ "$mode" = ab5 ]; then
  # session 21's tree (5aeca65) against this one
  ab_runs 85 600 "session 21 (5aeca65)"
elif [ "$mode" = ab6 ]; then
  # Same machine, alternating: session 22's tree (.gpu-assets/ab_old, `git archive 8a679fe verl benchmarks`) and
  # this one, 4 runs each (run 0 fills each bytecode cache and this tree's import-structure cache); then one
  # stack-sampled run of this tree, and the GPU tests of the code the changes touch.
  ab_runs 85 600 "session 22 (8a679fe)"
  cs="--shapes field --assets $PWD/.gpu-assets"
  VERL_STACK_SAMPLES="$W/stacks" VERL_STACK_SECONDS=40 PYTHONPATH="$PWD/benchmarks/stack_sampler:$PYTHONPATH" \
      timeout 70 python3 benchmarks/cold_start.py $cs --repeat 1 --out "$W/cold_sampled" > "$W/cold_sampled.log" 2>&1
  echo "cold start sampled exit $? at $(( $(date +%s) - t0 )) s"; grep -E "run 1/" "$W/cold_sampled.log"
  timeout "$(left 560)" python3 -m pytest -q -rs -m gpu tests/workers tests/utils tests/rollout > "$W/gpu_tests.log" 2>&1
  echo "gpu tests exit $? at $(( $(date +%s) - t0 )) s"; grep -E "passed|failed|SKIPPED|Error" "$W/gpu_tests.log" | tail -8 | cut -c1-300
elif [ "$mode" = final8 ]; then
  # The rollout GPU tests (graph windows), the p40 row (8 steps: gen with one decode window per decoder), then
  # the ab6 comparison once more, three alternations (run 0 of each fills its caches).
  timeout 120 python3 -m pytest -q -rs -m gpu tests/rollout > "$W/gpu_tests.log" 2>&1
  echo "gpu tests exit $? at $(( $(date +%s) - t0 )) s"; grep -E "passed|failed|Error" "$W/gpu_tests.log" | tail -4 | cut -c1-300
  row p40 p40 8 100
  phase_peaks "$W/p40/p40.jsonl"
  python3 - "$W/p40/p40.jsonl" <<'PY'
import json, sys
rows = [r for r in (json.loads(l)["data"] for l in open(sys.argv[1]) if l.strip()) if "timing_s/step" in r]
print("gen per step", [round(r["timing_s/gen"], 3) for r in rows], "step", [round(r["timing_s/step"], 3) for r in rows])
PY
  ab_runs 60 590 "session 22 (8a679fe)"
elif [ "$mode" = ab7 ]; then
  # ab6's comparison on the final tree (another machine, most likely), then the GPU tests of tests/compat.
  ab_runs 60 480 "session 22 (8a679fe)"
  timeout "$(left 560)" python3 -m pytest -q -rs -m gpu tests/compat > "$W/gpu_tests.log" 2>&1
  echo "gpu tests exit $? at $(( $(date +%s) - t0 )) s"; grep -E "passed|failed|Error" "$W/gpu_tests.log" | tail -4 | cut -c1-300
elif [ "$mode" = final7 ]; then
  timeout 300 python3 -m pytest -q -rs -m gpu tests/compat tests/utils tests/workers tests/rollout > "$W/gpu_tests.log" 2>&1
  echo "gpu tests exit $? at $(( $(date +%s) - t0 )) s"; grep -E "passed|failed|SKIPPED|Error" "$W/gpu_tests.log" | tail -8 | cut -c1-300
  row p40 p40 8 100
  phase_peaks "$W/p40/p40.jsonl"
  row quickstart quickstart 3 "$(left 560)"
elif [ "$mode" = qs6 ]; then
  row quickstart quickstart 6 230
elif [ "$mode" = rayprobe ]; then
  # Ray's own start with the bytecode cache the entry point sets up (the probe's children inherit it), then the
  # p40 cold start with Ray's dashboard left out, alternated with the default (run 0 fills the cache).
  export PYTHONPYCACHEPREFIX=$HOME/.cache/verl/pycache PYTHONDONTWRITEBYTECODE=
  timeout 100 python3 benchmarks/ray_init_probe.py --repeat 1 --out "$W/probe_fill" > /dev/null 2>&1
  timeout 150 python3 benchmarks/ray_init_probe.py --repeat 3 --out "$W/probe" > "$W/probe.log" 2>&1
  echo "ray_init_probe exit $? at $(( $(date +%s) - t0 )) s"; tail -6 "$W/probe.log"
  cs="--shapes field --assets .gpu-assets --repeat 1"
  for i in 0 1 2; do
    timeout 70 python3 benchmarks/cold_start.py $cs --out "$W/default_$i" > "$W/default_$i.log" 2>&1
    echo "default $i: $(grep -E 'run 1/' "$W/default_$i.log")"
    [ $i = 0 ] && continue
    timeout 70 python3 benchmarks/cold_start.py $cs --out "$W/nodash_$i" +ray_kwargs.ray_init.include_dashboard=False \
        > "$W/nodash_$i.log" 2>&1
    echo "no dashboard $i: $(grep -E 'run 1/' "$W/nodash_$i.log")"
  done
  for f in "$W"/default_[12]/cold_start.json "$W"/nodash_[12]/cold_start.json; do
    python3 -c "import json,sys; r=json.load(open(sys.argv[1]))['rows']['field']['runs'][0].get('startup', {}); print(sys.argv[1].split('/')[-2], {k: r.get(k) for k in ('ray_init', 'spawn_workers', 'wait_for_data', 'init_models', 'planning')})" "$f"
  done
elif [ "$mode" = gpu_tests ]; then
  timeout 420 python3 -m pytest -q -rs -m gpu tests/compat tests/utils tests/workers tests/rollout > "$W/gpu_tests.log" 2>&1
  echo "gpu tests exit $?"; grep -E "passed|failed|SKIPPED|Error" "$W/gpu_tests.log" | tail -12 | cut -c1-300
elif [ "$mode" = final6 ]; then
  timeout 130 python3 benchmarks/cold_start.py --shapes field --assets .gpu-assets --repeat 3 --out "$W/cold" \
      > "$W/cold.log" 2>&1
  echo "cold start exit $? at $(( $(date +%s) - t0 )) s"; grep -E "run [0-9]/|^\| " "$W/cold.log" | head -40
  grep -m1 "verl: bytecode" "$W"/cold/*.log 2>/dev/null | cut -c1-300; du -sh ~/.cache/verl/pycache
  row p40 p40 8 90
  phase_peaks "$W/p40/p40.jsonl"
  row quickstart quickstart 4 "$(( $(left 575) * 55 / 100 ))"
  row grpo grpo 4 "$(left 575)"
elif [ "$mode" = pycprobe ]; then
  { env | grep -E "^PYTHON|^PIP"; python3 - <<'PY'
import importlib.util, os, pathlib, sys
print("dont_write_bytecode", sys.flags.dont_write_bytecode, "pycache_prefix", sys.pycache_prefix)
for mod in ("torch", "transformers", "sympy", "sklearn", "ray", "hydra", "omegaconf", "datasets", "verl"):
    spec = importlib.util.find_spec(mod)
    root = pathlib.Path(spec.origin).parent
    init = importlib.util.cache_from_source(str(root / "__init__.py"))
    print(f"{mod:13s} {root}  .py {len(list(root.rglob('*.py')))}  .pyc {len(list(root.rglob('*.pyc')))}"
          f"  writable {os.access(root, os.W_OK)}  __init__ pyc {os.path.exists(init)}")
PY
  mount | grep -E " on / | on /opt| on /tmp| on /work" | cut -c1-160; } > "$W/env.log" 2>&1; cat "$W/env.log"
  imp="import time; t = time.perf_counter(); import torch, transformers; from transformers import Qwen2ForCausalLM"
  for i in 1 2; do python3 -c "$imp; print('import as is', round(time.perf_counter() - t, 2))"; done
  cs="--shapes field --assets .gpu-assets"
  timeout 80 python3 benchmarks/cold_start.py $cs --repeat 1 --out "$W/cold_asis" > "$W/cold_asis.log" 2>&1
  echo "cold start as is: exit $?"; grep -E "run [0-9]/" "$W/cold_asis.log"
  export PYTHONPYCACHEPREFIX=/tmp/pycache; unset PYTHONDONTWRITEBYTECODE
  for i in 1 2 3; do python3 -c "$imp; print('import with a bytecode cache', round(time.perf_counter() - t, 2))"; done
  timeout 200 python3 benchmarks/cold_start.py $cs --repeat 3 --out "$W/cold_cached" > "$W/cold_cached.log" 2>&1
  echo "cold start with a bytecode cache (run 1 fills it): exit $?"; grep -E "run [0-9]/|^\| " "$W/cold_cached.log" | head -40
  VERL_STACK_SAMPLES="$W/stacks" VERL_STACK_SECONDS=50 PYTHONPATH="$PWD/benchmarks/stack_sampler:$PYTHONPATH" \
      timeout 90 python3 benchmarks/cold_start.py $cs --repeat 1 --out "$W/cold_sampled" > "$W/cold_sampled.log" 2>&1
  echo "cold start sampled, with the cache: exit $?"; grep -E "run 1/" "$W/cold_sampled.log"
  du -sh /tmp/pycache
elif [ "$mode" = coldprobe ]; then
  # before anything imports torch on this fresh machine: the cold import, then warm pieces in fresh processes
  python3 -X importtime -c "import torch" 2> "$W/torch_importtime_cold.txt"; echo "cold torch import at $(( $(date +%s) - t0 )) s"
  python3 - > "$W/pieces.log" 2>&1 <<'PY'
import subprocess, sys
steps = {
    "import_torch": "import torch",
    "cuda_init": "import torch; torch.cuda.init()",
    "cuda_context": "import torch; torch.zeros(1, device='cuda')",
    "import_transformers_qwen2": "import torch, transformers; from transformers import Qwen2ForCausalLM",
    "import_fsdp_workers": "import verl.workers.fsdp_workers",
    "import_compat_plan": "import verl.compat",
}
for name, code in steps.items():
    for i in range(2):
        out = subprocess.run([sys.executable, "-c", f"import time; t=time.perf_counter(); {code}; print(round(time.perf_counter()-t, 3))"],
                             capture_output=True, text=True)
        print(name, i, out.stdout.strip() or out.stderr[-300:])
PY
  cat "$W/pieces.log"
  timeout 200 python3 benchmarks/ray_init_probe.py --repeat 2 --out "$W/ray_probe" > "$W/ray_probe.log" 2>&1
  echo "ray_init_probe exit $?"; tail -6 "$W/ray_probe.log"
  cold_starts 1
  timeout 150 python3 -m pytest -q -m gpu tests/workers tests/rollout > "$W/gpu_tests.log" 2>&1; echo "gpu tests exit $?"; tail -3 "$W/gpu_tests.log"
elif [ "$mode" = long_p40d ]; then
  long_p40 200 100 200 430
elif [ "$mode" = next13 ]; then
  timeout 150 python3 -m pytest -q -m gpu tests/workers tests/rollout > "$W/gpu_tests.log" 2>&1; echo "gpu tests exit $?"; tail -3 "$W/gpu_tests.log"
  timeout 150 python3 benchmarks/cold_start.py --shapes field --assets .gpu-assets --repeat 2 --out "$W/cold" > "$W/cold.log" 2>&1
  echo "cold_start exit $? at $(( $(date +%s) - t0 )) s"; grep -E "run [12]/|^\| " "$W/cold.log" | head -20
  row p40 p40 8 110
  phase_peaks "$W/p40/p40.jsonl"
  timeout "$(left 560)" python3 benchmarks/gpu_matrix.py --assets .gpu-assets --profiles p40,p100,v100-16gb,t4 \
      --steps 3 --test-freq 2 --jobs 8 --budget-gb 112 --cell-timeout 400 --out "$W/matrix" > "$W/matrix.log" 2>&1
  echo "matrix exit $? at $(( $(date +%s) - t0 )) s"; grep -E "exit|^\|" "$W/matrix.log" | tail -24
elif [ "$mode" = cold2 ]; then
  python3 -X importtime -c "import torch, transformers; from transformers import Qwen2ForCausalLM, AutoTokenizer" \
      2> "$W/transformers_importtime.txt"
  sort -t'|' -k2 -n -r "$W/transformers_importtime.txt" | head -12   # by cumulative time
  cold_starts 2
elif [ "$mode" = correctness ]; then
  timeout 170 python3 benchmarks/rollout_speed.py --skip-old --out "$W/rollout" > "$W/rollout.log" 2>&1; echo "rollout_speed exit $?"
  timeout 90 python3 -m pytest -q -m gpu tests/rollout > "$W/gpu_tests.log" 2>&1; echo "gpu tests exit $?"; tail -3 "$W/gpu_tests.log"
  timeout 420 python3 benchmarks/gpu_matrix.py --assets .gpu-assets --out "$W/matrix" --steps 3 --test-freq 2 \
      --jobs 6 --budget-gb 80 --cell-timeout 300 > "$W/matrix.log" 2>&1 &
  m=$!
  ONLY="t4_manual t4_auto v100-16gb_manual v100-16gb_auto" STEPS=5 RUN_TIMEOUT=300 OUT="$W/offload" \
      timeout 400 bash benchmarks/offload_e2e.sh > "$W/offload.log" 2>&1 &
  o=$!
  wait $m; echo "matrix exit $?"; wait $o; echo "offload exit $?"
  tail -25 "$W/rollout.log"
  tail -40 "$W/matrix.log"; tail -16 "$W/offload.log"
elif [ "$mode" = final ]; then
  # the GPU test, the matrix cells the correctness call's time limit cut, then the main speed rows alone
  timeout 60 python3 -m pytest -q -m gpu tests/rollout > "$W/gpu_tests.log" 2>&1; echo "gpu tests exit $?"; tail -2 "$W/gpu_tests.log"
  mx=(--assets .gpu-assets --steps 3 --test-freq 2 --budget-gb 110 --cell-timeout 200)
  timeout 210 python3 benchmarks/gpu_matrix.py "${mx[@]}" --profiles p100,v100-16gb,t4 --algos ppo,grpo --jobs 6 \
      --out "$W/matrix_a" > "$W/matrix_a.log" 2>&1 &
  timeout 210 python3 benchmarks/gpu_matrix.py "${mx[@]}" --profiles a100-40gb,rtx3090 --algos ppo --jobs 2 \
      --out "$W/matrix_b" > "$W/matrix_b.log" 2>&1 &
  wait; echo "matrix done at $(( $(date +%s) - t0 )) s"; grep -h "exit" "$W"/matrix_*.log
  SPEED_ROWS=p40,quickstart,grpo P40_STEPS=8 P40_TIMEOUT=80 QS_TIMEOUT=160 GRPO_TIMEOUT=120 \
      timeout 260 python3 benchmarks/speed.py --out "$W/speed" > "$W/speed.log" 2>&1
  echo "speed exit $?"; tail -22 "$W/speed.log"
elif [ "$mode" = profile ]; then
  timeout 240 python3 benchmarks/profile_step.py --model $MODEL --profiles h200 --settings quickstart,grpo --tgz-limit-mb 9 \
      --out "$W/profile" > "$W/profile.log" 2>&1; echo "profile_step exit $? at $(( $(date +%s) - t0 )) s"
  mm=(--model $MODEL --algos ppo,grpo --case-timeout 200)
  timeout 290 python3 benchmarks/memory_model.py "${mm[@]}" --profiles p40,p100,v100-16gb,t4,rtx3090,a100-40gb,h200 \
      --settings matrix --val-rows 256 --jobs 5 --out "$W/mm_matrix" > "$W/mm_matrix.log" 2>&1 &
  timeout 290 python3 benchmarks/memory_model.py "${mm[@]}" --profiles p40,t4 --settings field_report --jobs 2 \
      --out "$W/mm_field" > "$W/mm_field.log" 2>&1 &
  wait; echo "memory_model done at $(( $(date +%s) - t0 )) s"
  grep -A40 "summary\|families" "$W/profile.log" | head -80; tail -30 "$W/mm_matrix.log"; tail -12 "$W/mm_field.log"
elif [ "$mode" = next ]; then
  # generation and the log-prob forward under the profiler (alone), then the offload fix on a GPU,
  # then the fp16 matrix cells it changes
  timeout 150 python3 benchmarks/profile_step.py --model $MODEL --profiles h200 --settings quickstart \
      --phases generate_sequences,compute_log_prob,compute_values --profile-decode-steps 32 --tgz-limit-mb 9 \
      --out "$W/profile" > "$W/profile.log" 2>&1
  echo "profile_step exit $? at $(( $(date +%s) - t0 )) s"; grep -A14 "summary" "$W/profile.log" | head -50
  timeout 90 python3 -m pytest -q --noconftest -p no:cacheprovider tests/workers/test_offload_gpu.py > "$W/offload_gpu.log" 2>&1
  echo "offload GPU test exit $?"; tail -3 "$W/offload_gpu.log"
  timeout 300 python3 benchmarks/gpu_matrix.py --assets .gpu-assets --profiles t4,v100-16gb --algos ppo,grpo --steps 3 \
      --test-freq 2 --jobs 4 --budget-gb 120 --cell-timeout 240 --out "$W/matrix_fp16" > "$W/matrix_fp16.log" 2>&1
  echo "fp16 matrix exit $?"; tail -12 "$W/matrix_fp16.log"
elif [ "$mode" = decode ]; then
  # the compiled decode step: GPU tests, then compiled vs eager decode on the quick-start rollout shape
  timeout 150 python3 -m pytest -q -m gpu tests/rollout > "$W/gpu_tests.log" 2>&1; echo "gpu tests exit $?"; tail -3 "$W/gpu_tests.log"
  timeout 330 python3 benchmarks/rollout_speed.py --skip-old --cases h200,h200_eager --out "$W/rollout" > "$W/rollout.log" 2>&1
  echo "rollout_speed exit $? at $(( $(date +%s) - t0 )) s"; tail -8 "$W/rollout.log"
elif [ "$mode" = speed3 ]; then
  # the speed rows with compiled decode and layers and kept gathered weights, one at a time; if the quick start
  # gives no s/step, the GRPO row runs with torch.compile off so the call still measures something; then
  # the compile A/B of the quick start's update and log-prob phases in the time left
  SPEED_ROWS=quickstart QS_STEPS=5 QS_TIMEOUT=200 timeout 210 python3 benchmarks/speed.py --out "$W/speed" > "$W/speed.log" 2>&1
  echo "quickstart exit $? at $(( $(date +%s) - t0 )) s"; tail -12 "$W/speed.log"
  ok=$(python3 -c "import json; r=json.load(open('$W/speed/speed.json'))['rows']['quickstart']; print(int(bool(r.get('s_per_step'))))" 2>/dev/null)
  EXTRA=""; [ "$ok" = 1 ] || { EXTRA="actor_rollout_ref.actor.use_torch_compile=False"; grep -E "Error|error:" "$W"/speed/quickstart.log | tail -8; }
  SPEED_EXTRA="$EXTRA" SPEED_ROWS=grpo GRPO_STEPS=4 GRPO_TIMEOUT=190 timeout 200 python3 benchmarks/speed.py --out "$W/speed_grpo" > "$W/speed_grpo.log" 2>&1
  echo "grpo exit $? at $(( $(date +%s) - t0 )) s (extra: ${EXTRA:-none})"; tail -12 "$W/speed_grpo.log"
  left=$(( 570 - ($(date +%s) - t0) ))
  if [ $left -gt 90 ]; then
    A=actor_rollout_ref.actor.use_torch_compile
    TORCH_LOGS=recompiles timeout $left python3 benchmarks/profile_step.py --model $MODEL --profiles h200 --settings quickstart \
        --steps 1 --phases compute_log_prob,update_actor --tgz-limit-mb 9 --variant "eager=$A=False" --variant "compiled=" \
        --out "$W/compile" > "$W/compile.log" 2>&1
    echo "compile A/B exit $?"; sed -n '/^profile  setting/,/^$/p' "$W/compile/profile_step.txt"
    grep -iE "recompil|limit" "$W/compile.log" | cut -c1-160 | sort | uniq -c | sort -rn | head -6
  fi
elif [ "$mode" = speed4 ]; then
  # the windowed, trimmed decode: its GPU tests, the GRPO row (the goal still open), then decode speed on
  # GSM8K-like prompts padded to 512 (h200_short: what trimming serves) and on near-full prompts (h200)
  timeout 150 python3 -m pytest -q -m gpu tests/rollout > "$W/gpu_tests.log" 2>&1; echo "gpu tests exit $?"; tail -3 "$W/gpu_tests.log"
  SPEED_ROWS=grpo GRPO_STEPS=4 GRPO_TIMEOUT=200 timeout 210 python3 benchmarks/speed.py --out "$W/speed_grpo" > "$W/speed_grpo.log" 2>&1
  echo "grpo exit $? at $(( $(date +%s) - t0 )) s"; tail -12 "$W/speed_grpo.log"
  left=$(( 560 - ($(date +%s) - t0) ))
  timeout $left python3 benchmarks/rollout_speed.py --skip-old --cases h200_short,h200 --out "$W/rollout" > "$W/rollout.log" 2>&1
  echo "rollout_speed exit $? at $(( $(date +%s) - t0 )) s"; tail -8 "$W/rollout.log"
elif [ "$mode" = long_p40 ]; then
  # issue 8's 200-step run of the field report's settings under the p40 profile: perf/max_memory_allocated_gb
  # per step (flat, no crash), with validation every 50 steps on 256 test prompts and checkpoints at 100 and 200
  # (the field report validated and saved every 10 and crashed at step 9)
  SPEED_EXTRA="trainer.test_freq=50 data.val_max_samples=256 trainer.save_freq=100 trainer.default_local_dir=/tmp/ckpt_p40" \
      SPEED_ROWS=p40 P40_STEPS=200 P40_TIMEOUT=540 timeout 550 python3 benchmarks/speed.py --out "$W/p40" > "$W/p40.log" 2>&1
  echo "p40 200 steps exit $? at $(( $(date +%s) - t0 )) s"; tail -10 "$W/p40.log"
  python3 benchmarks/summarize_run.py "$W/p40/p40.jsonl" 2>&1 | tail -12; ls /tmp/ckpt_p40 2>&1 | head
  python3 -c "import json,sys; sys.path.insert(0,'benchmarks'); from summarize_run import summarize
m=summarize('$W/p40/p40.jsonl')['max_allocated_gb_by_step']; print('peak GiB by step', len(m), 'steps: step 1', m[0],
'| steps 2+ min', min(m[1:] or m), 'max', max(m[1:] or m), '| every 25th', m[::25])"
elif [ "$mode" = long_p40b ]; then
  # long_p40, with the per-step memory growth diagnosis (benchmarks/memory_growth.py: h200 GRPO and p40 field
  # shapes, allocation sites of what each step adds) beside it for its first ~2 minutes
  timeout 240 python3 benchmarks/memory_growth.py --model $MODEL --profile h200 --algo grpo --shape grpo --steps 6 \
      --json "$W/growth_h200.json" > "$W/growth_h200.log" 2>&1 &
  timeout 240 python3 benchmarks/memory_growth.py --model $MODEL --profile p40 --algo ppo --shape field --steps 10 \
      --json "$W/growth_p40.json" > "$W/growth_p40.log" 2>&1 &
  SPEED_EXTRA="trainer.test_freq=50 data.val_max_samples=256 trainer.save_freq=100 trainer.default_local_dir=/tmp/ckpt_p40" \
      SPEED_ROWS=p40 P40_STEPS=200 P40_TIMEOUT=540 timeout 550 python3 benchmarks/speed.py --out "$W/p40" > "$W/p40.log" 2>&1
  echo "p40 200 steps exit $? at $(( $(date +%s) - t0 )) s"; tail -6 "$W/p40.log"
  wait
  for g in p40 h200; do echo "== growth $g"; grep -A40 "^step 1" "$W/growth_$g.log" | grep -v Warn | cut -c1-240; done
  ls /tmp/ckpt_p40 2>&1 | head
  python3 - "$W/p40/p40.jsonl" <<'PY'
import json, sys
rows = [json.loads(l)["data"] for l in open(sys.argv[1]) if l.strip()]
rows = [r for r in rows if "timing_s/step" in r]
key = "perf/max_memory_allocated_gb"
print("steps", len(rows), "| run peak: step 1", round(rows[0][key], 2), "last", round(rows[-1][key], 2))
for phase in ("gen", "update_actor", "update_critic", "validation"):
    v = [(i + 1, round(r[f"{key}/{phase}"], 3)) for i, r in enumerate(rows) if f"{key}/{phase}" in r]
    print(phase, "peak GiB (step, value) every 20th:", v[::20], "last", v[-1:] if v else None)
PY
elif [ "$mode" = next8 ]; then
  # not yet run on a GPU: the square SDPA mask (cuDNN's NaN backward, pytorch#196678), the single warm-up stream
  # (no device memory left per recording) and the pinned offload, by their GPU tests; then the GRPO and
  # quick-start rows with real optimizer steps (every bf16 step of the earlier rows was skipped on a NaN grad
  # norm: summarize_run now counts skipped updates)
  # the driver's plan stage alone (8.6 s of the quick start's start-up): wall and the slowest imports
  a=$(date +%s.%N); timeout 60 python3 -X importtime -m verl.compat --json trainer.n_gpus_per_node=1 \
      actor_rollout_ref.model.path=$MODEL > "$W/plan.json" 2> "$W/importtime.log"
  echo "plan alone: $(awk "BEGIN{print $(date +%s.%N) - $a}") s"
  grep "import time:" "$W/importtime.log" | sort -t'|' -k2 -n -r | head -12 | cut -c1-110
  timeout 150 python3 -m pytest -q -m gpu tests/rollout tests/workers/test_attention_mask.py \
      tests/workers/test_offload_gpu.py > "$W/gpu_tests.log" 2>&1; echo "gpu tests exit $?"; tail -4 "$W/gpu_tests.log"
  row grpo grpo 6 220
  row qs quickstart 5 "$(left 565)"
elif [ "$mode" = next9 ]; then
  # torch_varlen (torch's varlen FlashAttention kernel, packed micro-batches): its GPU tests, then the
  # quick-start and GRPO rows on the plan that now packs; if the tests fail, the p40 and TRL rows instead
  timeout 200 python3 -m pytest -q -m gpu tests/workers/test_varlen_gpu.py tests/workers/test_attention_mask.py \
      > "$W/gpu_tests.log" 2>&1; rc=$?; echo "gpu tests exit $rc"; tail -15 "$W/gpu_tests.log" | cut -c1-300
  if [ $rc -eq 0 ]; then
    row qs quickstart 5 200
    grep -m3 "torch_varlen\|use_remove_padding" "$W/qs/quickstart.log" 2>/dev/null | cut -c1-200
    row grpo grpo 5 "$(left 560)"
  else
    row p40 p40 8 100
    row trl trl 2 "$(left 560)"
  fi
elif [ "$mode" = final5 ]; then
  # the built-in engine's speed rows on the current code (h200 bf16 256 x 512 new; p40 decode of 1 sequence)
  timeout 330 python3 benchmarks/rollout_speed.py --skip-old --out "$W/rollout" > "$W/rollout.log" 2>&1
  echo "rollout_speed exit $?"; tail -14 "$W/rollout.log" | cut -c1-220
elif [ "$mode" = next8a ]; then
  # next8's first half, for a call of ~340 s: the three GPU tests, then the GRPO row with real optimizer steps
  timeout 120 python3 -m pytest -q -m gpu tests/rollout tests/workers/test_attention_mask.py \
      tests/workers/test_offload_gpu.py > "$W/gpu_tests.log" 2>&1; echo "gpu tests exit $?"; tail -4 "$W/gpu_tests.log"
  row grpo grpo 5 "$(( $(left "${NEXT8A_WALL:-330}") - 5 ))"
  python3 - "$W/grpo/grpo.jsonl" <<'PY'
import json, sys
rows = [json.loads(l)["data"] for l in open(sys.argv[1]) if l.strip()]
print("actor/grad_norm by step:", [r.get("actor/grad_norm") for r in rows if "timing_s/step" in r])
print("update_actor s by step:", [round(r.get("timing_s/update_actor", 0), 3) for r in rows if "timing_s/step" in r])
print("mfu by step:", [round(r.get("perf/mfu/actor", 0), 4) for r in rows if "timing_s/step" in r])
PY
elif [ "$mode" = final4 ]; then
  # the decode's GPU tests (one warm-up stream: no memory left behind per recording), the field report under
  # p40 for 8 steps (per-phase peaks flat from step 2), then TRL's GRPOTrainer row with what is left
  timeout 100 python3 -m pytest -q -m gpu tests/rollout > "$W/gpu_tests.log" 2>&1; echo "gpu tests exit $?"; tail -3 "$W/gpu_tests.log"
  row p40 p40 8 100
  python3 - "$W/p40/p40.jsonl" <<'PY'
import json, sys
rows = [json.loads(l)["data"] for l in open(sys.argv[1]) if l.strip()]
rows = [r for r in rows if "timing_s/step" in r]
for phase in ("gen", "update_actor"):
    print(phase, [round(r.get(f"perf/max_memory_allocated_gb/{phase}", 0), 3) for r in rows])
PY
  row trl trl 2 "$(left "${FINAL4_WALL:-360}")"
  grep -iE "error|Traceback" -A3 "$W/trl/trl.log" 2>/dev/null | head -12
elif [ "$mode" = speed5 ]; then
  # TRL's GRPOTrainer beside ours on the GRPO shape (needs `bash benchmarks/pack_trl.sh` before the call),
  # then the quick-start row on the windowed decode
  row trl trl 3 250
  row qs quickstart 5 "$(left 560)"
elif [ "$mode" = speed6 ]; then
  # grown token budgets (one micro-batch per mini-batch on the H200) and pinned optimizer offload: the GPU
  # tests of the offload, the GRPO row, the field report under p40 with both optimizer offloads forced (the
  # memory goal's price), then the quick-start row (MFU) with what is left
  timeout 90 python3 -m pytest -q -m gpu --noconftest tests/workers/test_offload_gpu.py tests/utils/test_phase_peak.py \
      > "$W/gpu_tests.log" 2>&1; echo "gpu tests exit $?"; tail -3 "$W/gpu_tests.log"
  row grpo grpo 6 230
  SPEED_EXTRA="$OPT_OFFLOAD" row p40_off p40 10 110
  row qs quickstart 4 "$(left 565)"
elif [ "$mode" = speed7 ]; then
  # the pinned offload's GPU test again (DTensor state), where the device memory of a step goes from step to step
  # (the GRPO row's per-phase peaks rose ~0.25 GiB a step), the p40 field report with optimizer offload, and a
  # profile of the quick-start update under the grown budgets
  timeout 90 python3 -m pytest -q -m gpu --noconftest tests/workers/test_offload_gpu.py > "$W/gpu_tests.log" 2>&1
  echo "gpu tests exit $?"; tail -3 "$W/gpu_tests.log"
  timeout 200 python3 benchmarks/memory_growth.py --model $MODEL --profile h200 --algo grpo --shape grpo --steps 6 \
      --json "$W/growth_h200.json" > "$W/growth_h200.log" 2>&1 &
  g=$!
  timeout 200 python3 benchmarks/memory_growth.py --model $MODEL --profile p40 --algo ppo --shape field --steps 8 \
      --json "$W/growth_p40.json" > "$W/growth_p40.log" 2>&1
  echo "growth p40 exit $?"; grep -A14 "^step 1" "$W/growth_p40.log"
  wait $g; echo "growth h200 exit $? at $(( $(date +%s) - t0 )) s"; grep -A14 "^step 1" "$W/growth_h200.log"
  SPEED_EXTRA="$OPT_OFFLOAD" row p40_off p40 10 110
  timeout "$(left 560)" python3 benchmarks/profile_step.py --model $MODEL --profiles h200 --settings quickstart --steps 2 \
      --phases update_actor --tgz-limit-mb 9 --out "$W/profile" > "$W/profile.log" 2>&1
  echo "profile exit $? at $(( $(date +%s) - t0 )) s"; sed -n '/^profile  setting/,/^$/p' "$W/profile/profile_step.txt"
elif [ "$mode" = final3 ]; then
  # the whole matrix on this session's code (compiled layers and decode on sm_70+ profiles, kept gathers),
  # 3 steps with validation at steps 2 and 3; inductor's on-disk cache is shared by the cells
  timeout 565 python3 benchmarks/gpu_matrix.py --assets .gpu-assets --steps 3 --test-freq 2 --jobs 8 --budget-gb 136 \
      --cell-timeout 400 --out "$W/matrix" > "$W/matrix.log" 2>&1
  echo "matrix exit $? at $(( $(date +%s) - t0 )) s"; grep -E "exit|^\|" "$W/matrix.log" | tail -32
elif [ "$mode" = matrix_a ] || [ "$mode" = matrix_b ]; then
  # the matrix in two calls, so every cell (first steps compiling 50-140 s) finishes inside one call's limit
  P=$([ "$mode" = matrix_a ] && echo "p40,p100,v100-16gb,t4" || echo "rtx3090,a100-40gb,h200")
  timeout 60 python3 -m pytest -q --noconftest -p no:cacheprovider tests/utils/test_phase_peak.py > "$W/phase_peak.log" 2>&1
  echo "phase-peak GPU test exit $?"; tail -2 "$W/phase_peak.log"
  timeout 560 python3 benchmarks/gpu_matrix.py --assets .gpu-assets --profiles "$P" --steps 3 --test-freq 2 --jobs 8 \
      --budget-gb 136 --cell-timeout 420 --out "$W/matrix" > "$W/matrix.log" 2>&1
  echo "matrix exit $? at $(( $(date +%s) - t0 )) s"; grep -E "exit|^\|" "$W/matrix.log" | tail -40
elif [ "$mode" = next11 ]; then
  # the p40 field report alone for 8 steps (per-phase peaks), then the pre-Ampere profiles' matrix cells (their
  # one-device plans now run unwrapped; PPO + critic and GRPO + KL, 3 steps, validation at step 2) with the
  # allocator's peak breakdown of the p40 field report beside them
  row p40 p40 8 110
  phase_peaks "$W/p40/p40.jsonl"
  timeout 170 python3 benchmarks/peak_breakdown.py --model $MODEL --profile p40 --shape field --algo ppo \
      --json "$W/breakdown.json" > "$W/breakdown.log" 2>&1 &
  b=$!
  timeout "$(left 585)" python3 benchmarks/gpu_matrix.py --assets .gpu-assets --profiles p40,p100,v100-16gb,t4 \
      --steps 3 --test-freq 2 --jobs 8 --budget-gb 112 --cell-timeout 420 --out "$W/matrix" > "$W/matrix.log" 2>&1 &
  m=$!
  wait $b; echo "breakdown exit $? at $(( $(date +%s) - t0 )) s"
  grep -E "^[a-z_]+: resident|GiB  " "$W/breakdown.log" | grep -v " 0.000 GiB" | cut -c1-200
  wait $m; echo "matrix exit $? at $(( $(date +%s) - t0 )) s"; grep -E "exit|^\|" "$W/matrix.log" | tail -24
elif [ "$mode" = long_p40c ]; then
  # the field report under p40 for 120 steps on the unwrapped plan: per-step peaks (flat, no crash), validation
  # every 40 steps on 256 test prompts, checkpoints at 60 and 120; then the same command resumed for 2 more steps
  long_p40 120 40 60 340
  SPEED_EXTRA="$X trainer.resume_mode=auto" SPEED_ROWS=p40 P40_STEPS=122 P40_TIMEOUT="$(( $(left 570) - 10 ))" \
      timeout "$(left 570)" python3 benchmarks/speed.py --out "$W/resume" > "$W/resume.log" 2>&1
  echo "resume exit $? at $(( $(date +%s) - t0 )) s"; grep -ihm3 "resum\|global_step_120" "$W/resume/p40.log" | cut -c1-200
  python3 benchmarks/summarize_run.py "$W/resume/p40.jsonl" 2>&1 | tail -3
elif [ "$mode" = next12 ]; then
  # the sm_80 profiles' cells (their GRPO reference now unwrapped) beside the allocator's breakdown of the t4
  # cell's phases (fp16 autocast over unwrapped fp32 weights, where the memory model over-predicts)
  timeout 200 python3 benchmarks/peak_breakdown.py --model $MODEL --profile t4 --shape matrix --algo ppo \
      --json "$W/breakdown.json" > "$W/breakdown.log" 2>&1 &
  b=$!
  timeout 230 python3 benchmarks/gpu_matrix.py --assets .gpu-assets --profiles rtx3090,a100-40gb --steps 3 \
      --test-freq 2 --jobs 4 --budget-gb 112 --cell-timeout 220 --out "$W/matrix" > "$W/matrix.log" 2>&1 &
  m=$!
  wait $b; echo "breakdown exit $? at $(( $(date +%s) - t0 )) s"
  grep -E "^[a-z_]+: resident|GiB  |plan's terms" "$W/breakdown.log" | grep -v " 0.00[0-4] GiB" | cut -c1-220
  wait $m; echo "matrix exit $? at $(( $(date +%s) - t0 )) s"; grep -E "exit|^\|" "$W/matrix.log" | tail -14
elif [ "$mode" = next10 ]; then
  # on one device a model FSDP2 would only copy runs unwrapped: the GPU tests, the allocator's breakdown of
  # each phase's peak for the p40 field report, its row for 8 steps (per-phase peaks), then the GRPO row
  # (its bfloat16 reference is now unwrapped)
  timeout 150 python3 -m pytest -q -m gpu tests/workers tests/rollout > "$W/gpu_tests.log" 2>&1
  echo "gpu tests exit $?"; tail -5 "$W/gpu_tests.log" | cut -c1-300
  timeout 170 python3 benchmarks/peak_breakdown.py --model $MODEL --profile p40 --shape field --algo ppo \
      --json "$W/breakdown.json" > "$W/breakdown.log" 2>&1
  echo "breakdown exit $? at $(( $(date +%s) - t0 )) s"; grep -vE "^Loading|Writing|it/s" "$W/breakdown.log" | tail -64 | cut -c1-240
  row p40 p40 8 110
  phase_peaks "$W/p40/p40.jsonl"
  row grpo grpo 5 "$(left 570)"
elif [ "$mode" = matrix_c ]; then
  # the sm_80 profiles below the H200 now plan torch_varlen with packed micro-batches: their matrix cells
  # (PPO + critic, GRPO + KL; 2 steps, validation at step 2) under their memory caps
  timeout 190 python3 benchmarks/gpu_matrix.py --assets .gpu-assets --profiles rtx3090,a100-40gb --steps 2 \
      --test-freq 2 --jobs 4 --budget-gb 136 --cell-timeout 180 --out "$W/matrix" > "$W/matrix.log" 2>&1
  echo "matrix exit $? at $(( $(date +%s) - t0 )) s"; grep -E "exit|^\|" "$W/matrix.log" | tail -14
  grep -h "torch_varlen" "$W"/matrix/*.log 2>/dev/null | grep -m2 "actor " | cut -c1-160
elif [ "$mode" = matrix_d ]; then
  # matrix_c cut to what little device time is left: the rtx3090 PPO cell, one step and a validation
  timeout 135 python3 benchmarks/gpu_matrix.py --assets .gpu-assets --profiles rtx3090 --algos ppo --steps 1 \
      --test-freq 1 --jobs 1 --budget-gb 136 --cell-timeout 125 --out "$W/matrix" > "$W/matrix.log" 2>&1
  echo "matrix exit $? at $(( $(date +%s) - t0 )) s"; grep -E "exit|^\|" "$W/matrix.log" | tail -6
  grep -h "torch_varlen" "$W"/matrix/*.log 2>/dev/null | grep -m2 "actor " | cut -c1-160
elif [ "$mode" = final2 ]; then
  # the matrix with the calibrated planner (3 steps, validation at steps 2 and 3), then the p40 and quick-start rows alone
  timeout 270 python3 benchmarks/gpu_matrix.py --assets .gpu-assets --steps 3 --test-freq 2 --jobs 8 --budget-gb 136 \
      --cell-timeout 200 --out "$W/matrix" > "$W/matrix.log" 2>&1
  echo "matrix exit $? at $(( $(date +%s) - t0 )) s"; grep -E "exit|^\|" "$W/matrix.log" | tail -32
  SPEED_ROWS=p40,quickstart P40_STEPS=6 QS_STEPS=5 P40_TIMEOUT=80 QS_TIMEOUT=140 \
      timeout 230 python3 benchmarks/speed.py --out "$W/speed" > "$W/speed.log" 2>&1
  echo "speed exit $? at $(( $(date +%s) - t0 )) s"; tail -16 "$W/speed.log"
elif [ "$mode" = speed2 ]; then
  # the update phases under the profiler (quick start, alone), then the main speed rows one at a time
  timeout 120 python3 benchmarks/profile_step.py --model $MODEL --profiles h200 --settings quickstart \
      --phases update_actor --tgz-limit-mb 9 --out "$W/profile" > "$W/profile.log" 2>&1
  echo "profile_step exit $? at $(( $(date +%s) - t0 )) s"
  SPEED_ROWS=quickstart,grpo QS_STEPS=3 GRPO_STEPS=3 QS_TIMEOUT=130 GRPO_TIMEOUT=120 \
      timeout 260 python3 benchmarks/speed.py --out "$W/speed" > "$W/speed.log" 2>&1
  echo "speed exit $? at $(( $(date +%s) - t0 )) s"; tail -22 "$W/speed.log"
  grep -h "startup" "$W"/speed/*.log | head -30
  head -8 "$W/profile/profile_step.txt"; grep -E "^(===|---|families|busy|plan)" "$W/profile/profile_step.txt" | cut -c1-400 | head -30
elif [ "$mode" = variants ]; then
  # the quick start's forward and backward passes under other plans, to set beside the profile call's
  # quickstart rows (the plan as planned): checkpointing on, larger token budgets
  A=actor_rollout_ref; CKPT="$A.model.enable_gradient_checkpointing=True,critic.model.enable_gradient_checkpointing=True"
  B32="$A.actor.ppo_max_token_len_per_gpu=32768,$A.rollout.log_prob_max_token_len_per_gpu=32768"
  B32="$B32,critic.ppo_max_token_len_per_gpu=32768,critic.forward_max_token_len_per_gpu=32768"
  timeout 500 python3 benchmarks/profile_step.py --model $MODEL --profiles h200 --settings quickstart --tgz-limit-mb 14 \
      --phases compute_log_prob,compute_values,update_critic,update_actor --variant "ckpt=$CKPT" --variant "b32k=$B32" \
      --variant "ckpt_b64k=${B32//32768/65536},$CKPT" --out "$W/variants" > "$W/variants.log" 2>&1
  echo "variants exit $?"; sed -n '/^profile  setting/,/^$/p' "$W/variants/profile_step.txt"
elif [ "$mode" = reshard ]; then
  # FSDP2 reshard_after_forward as the plan decides it (false on one device where the kept copy fits) against
  # upstream's true: update wall time and copy/cast kernels; then predicted vs measured update peaks with the
  # kept copy (h200: every role keeps it; p40: PPO keeps it, GRPO's actor does not fit it and reshards)
  R="actor_rollout_ref.actor.fsdp_config.reshard_after_forward=True,critic.fsdp.reshard_after_forward=True"
  timeout 300 python3 benchmarks/profile_step.py --model $MODEL --profiles h200 --settings quickstart --steps 3 \
      --phases update_critic,update_actor --variant "planned=" --variant "reshard=$R" --tgz-limit-mb 9 \
      --out "$W/profile" > "$W/profile.log" 2>&1
  echo "profile_step exit $?"; sed -n '/^profile  setting/,/^$/p' "$W/profile/profile_step.txt"
  grep -E "^(===|--- update|families|busy)" "$W/profile/profile_step.txt" | cut -c1-300
  timeout 240 python3 benchmarks/memory_model.py --model $MODEL --profiles h200,p40 --settings matrix --algos ppo,grpo \
      --val-rows 256 --jobs 4 --out "$W/memory" > "$W/memory.log" 2>&1
  echo "memory_model exit $?"; tail -30 "$W/memory.log"
elif [ "$mode" = compile ]; then
  # eager first, then compiled (its compile is paid in the compiled case's first calls: "first s" column)
  A=actor_rollout_ref.actor.use_torch_compile
  TORCH_LOGS=recompiles timeout 540 python3 benchmarks/profile_step.py --model $MODEL --profiles h200 --settings quickstart --steps 2 \
      --phases compute_log_prob,compute_values,update_critic,update_actor --tgz-limit-mb 14 \
      --variant "eager=$A=False" --variant "compiled=$A=True" --out "$W/compile" > "$W/compile.log" 2>&1
  echo "compile variants exit $?"; sed -n '/^profile  setting/,/^$/p' "$W/compile/profile_step.txt"
  grep -E "^(===|plan|families|busy)" "$W/compile/profile_step.txt" | cut -c1-300
  grep -iE "recompil|triggered by|guard fail|limit|error" "$W/compile.log" | cut -c1-200 | sort | uniq -c | sort -rn | head -16
else
  SPEED_ROWS=${SPEED_ROWS:-quickstart,p40,grpo,p40_manual} QS_TIMEOUT=200 P40_STEPS=8 P40_TIMEOUT=110 \
      GRPO_TIMEOUT=150 MANUAL_TIMEOUT=80 timeout 560 python3 benchmarks/speed.py --out "$W" > "$W/speed.log" 2>&1
  echo "speed exit $?"; tail -40 "$W/speed.log"
fi
echo "wall $(( $(date +%s) - t0 )) s"
