"""Upstream's Qwen2.5-VL geo3k GRPO script, as shipped, on a Qwen2.5-VL-3B-shaped model: s/step, phases, peaks.

The model (random weights, the real tokenizer) and the geo3k-shaped data (random images) are built on first use
by the test helpers `tests/tiny_vl_model.py` and `tests/vision_data.py`:
    python benchmarks/vision.py --profile h200 --batch 16 --out DIR          # one H200 as itself
    python benchmarks/vision.py --profile p40 --batch 4 --out DIR            # simulated P40: float32, offloaded
    python benchmarks/vision.py --tiny --profile cpu --batch 2 --response 8 --out DIR    # CPU smoke run
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402

SCRIPT = "examples/grpo_trainer/run_qwen2_5_vl-3b_geo3k.sh"


def build(model: Path, data: Path, tiny: bool, image_size: int, rows: int) -> None:
    """The model folder and data/geo3k/{train,test}.parquet, each unless already there."""
    helpers = harness.ROOT / "tests"
    if not (model / "config.json").exists():
        shape = [] if tiny else ["--shape", "qwen2.5-vl-3b", "--device", "cuda", "--dtype", "bfloat16"]
        subprocess.run([sys.executable, str(helpers / "tiny_vl_model.py"), str(model), "--tokenizer",
                        f"{harness.ASSETS}/tok", *shape], check=True, cwd=harness.ROOT, env=harness.env())
    if not (data / "geo3k" / "train.parquet").exists():
        subprocess.run([sys.executable, str(helpers / "vision_data.py"), str(data), "--rows", str(rows),
                        "--image-size", str(image_size)], check=True, cwd=harness.ROOT, env=harness.env())


def main(argv=None) -> int:
    ap = harness.parser(__doc__, "bench_out/vision")
    ap.add_argument("--profile", default="h200", help="compat.device (cpu: none simulated)")
    ap.add_argument("--batch", type=int, default=16, help="prompts per step (x 4 samples)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--response", type=int, default=1024, help="data.max_response_length")
    ap.add_argument("--image-size", type=int, default=840, help="pixels a side: 840 is ~900 image tokens")
    ap.add_argument("--rows", type=int, default=256, help="rows per split")
    ap.add_argument("--model", default="/tmp/qwen25vl-3b-random")
    ap.add_argument("--data", default="/tmp/geo3k-random")
    ap.add_argument("--tiny", action="store_true", help="a 2-layer model with the real vocabulary (CPU)")
    ap.add_argument("--timeout", type=int, default=560)
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    build(Path(args.model), Path(args.data), args.tiny, args.image_size, args.rows)
    overrides = [f"data.train_batch_size={args.batch}", f"actor_rollout_ref.actor.ppo_mini_batch_size={args.batch}",
                 "actor_rollout_ref.rollout.n=4", f"data.max_response_length={args.response}",
                 f"trainer.total_training_steps={args.steps}", "trainer.test_freq=-1", "trainer.resume_mode=disable",
                 f"trainer.default_local_dir={out}/checkpoints", "trainer.logger=[console,file]"]
    if args.profile != "cpu":
        overrides.append(f"compat.device={args.profile}")
    jsonl, log = out / f"vision_{args.profile}.jsonl", out / f"vision_{args.profile}.log"
    jsonl.unlink(missing_ok=True)
    env = harness.env(VERL_FILE_LOGGER_PATH=str(jsonl), MODEL=args.model, DATA=f"{args.data}/geo3k")
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])   # the script's python3: ours
    start = time.perf_counter()
    with open(log, "w") as fp:
        try:
            code = subprocess.run(["bash", SCRIPT, *overrides], stdout=fp, stderr=subprocess.STDOUT, cwd=harness.ROOT,
                                  env=env, timeout=args.timeout).returncode
        except subprocess.TimeoutExpired:
            code = "timeout"
    row = {"profile": args.profile, "batch": args.batch, "exit": code, "wall_s": round(time.perf_counter() - start, 1)}
    if jsonl.exists() and jsonl.read_text().strip():
        row.update(harness.summarize(jsonl))
    (out / f"vision_{args.profile}.json").write_text(json.dumps(row, indent=1))
    print(json.dumps({k: row.get(k) for k in ("profile", "exit", "steps", "s_per_step", "first_step_s", "timing_s",
                                              "phase_peak_gb", "memory_gb")}, indent=1))
    return 0 if code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
