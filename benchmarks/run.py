"""The one runner: a named suite of benchmark steps, each a tool of this folder with its arguments.

    python benchmarks/run.py SUITE [--only STEP,...] [--out DIR] [--dry-run]      # --list: suites and steps
"""
from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402
from matrix import PROFILES, devices  # noqa: E402
# suite -> step -> (seconds, tool and its arguments); `{out}` is the step's folder
SUITES = {
    "speed": {       # end-to-end s/step, MFU, peak memory; TRL beside ours; the built-in engine's decode speed
        "rows": (540, ["speed.py", "--rows", "quickstart,p40,grpo", "--steps", "3", "--timeout", "170"]),
        "trl": (300, ["speed.py", "--rows", "trl", "--steps", "3", "--timeout", "280"]),
        # the built-in engine's generate on the quick-start shape, compiled decode and eager; one P40 sequence
        "rollout": (420, ["profile_step.py", "--profiles", "h200", "--settings", "quickstart", "--phases",
                          "generate_sequences", "--steps", "2", "--prompt-tokens", "256:512", "--variant", "compiled=",
                          "--variant", "eager=actor_rollout_ref.actor.use_torch_compile=False"]),
        "rollout-p40": (200, ["profile_step.py", "--profiles", "p40", "--settings", "field", "--phases",
                              "generate_sequences", "--steps", "2", "--prompt-tokens", "full"]),
        # the GRPO row's generate (256 x (512 + 512), GSM8K-like 48-128 real prompt tokens): tokens/s of the phase
        "rollout-grpo": (240, ["profile_step.py", "--profiles", "h200", "--settings", "grpo", "--phases",
                               "generate_sequences", "--steps", "3", "--profile-decode-steps", "64"]),
    },
    "startup": {     # launch to first step, per start-up stage; run 1 fills the caches
        "cold": (400, ["speed.py", "--rows", "p40", "--steps", "1", "--repeat", "4", "--timeout", "95"]),
    },
    "phases": {      # per phase of one step: time and kernels under the profiler; memory against the model
        "profile": (300, ["profile_step.py", "--profiles", "h200", "--settings", "quickstart,grpo"]),
        "memory": (290, ["memory_model.py", "--profiles", ",".join(PROFILES), "--settings", "matrix", "--algos", "ppo,grpo",
                         "--val-rows", "256", "--jobs", "5", "--case-timeout", "200"]),
    },
    "matrix": {      # the stock command under every simulated device profile, PPO and GRPO, on the 0.5B shape
        "pre-ampere": (570, ["matrix.py", "--settings", "matrix", "--cells", devices(PROFILES[:4]),
                             "--jobs", "8", "--budget-gb", "112", "--timeout", "420"]),
        "ampere-hopper": (570, ["matrix.py", "--settings", "matrix", "--cells", devices(PROFILES[4:]),
                                "--jobs", "6", "--budget-gb", "112", "--timeout", "420"]),
    },
    "scale": {       # model scale on one device: 1.5B-7B per profile and mode, predicted vs measured peak per phase
        "small": (580, ["matrix.py", "--cells", "p40:1.5b:full,t4:1.5b:full,rtx3090:3b:full,p40:3b:full",
                        "--jobs", "4", "--timeout", "480"]),
        "7b": (580, ["matrix.py", "--cells", "p40:7b:lora,t4:7b:qlora,rtx3090:7b:lora,a100-40gb:7b:full",
                     "--jobs", "3", "--timeout", "480"]),
    },
}
PACK_FILE_LIMIT = 8 * 2**20


def choose(suite: str, only: str | None) -> dict:
    """The suite's steps (all, or those named in `only`); an unknown name is an error listing the valid ones."""
    if suite not in SUITES:
        raise SystemExit(f"unknown suite {suite!r}; the suites are: {', '.join(SUITES)} (python benchmarks/run.py --list)")
    steps = SUITES[suite]
    wanted = [s for s in (only or "").split(",") if s] or list(steps)
    if unknown := [s for s in wanted if s not in steps]:
        raise SystemExit(f"unknown step(s) {', '.join(unknown)} in suite {suite!r}; its steps are: {', '.join(steps)}")
    return {name: steps[name] for name in wanted}


def pack(folder: Path, target: Path) -> list[str]:
    """Tar the suite's folder; files over PACK_FILE_LIMIT stay out (returned)."""
    left_out = []
    with tarfile.open(target, "w:gz") as tar:
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            if path.stat().st_size > PACK_FILE_LIMIT:
                left_out.append(str(path.relative_to(folder)))
            else:
                tar.add(path, arcname=str(path.relative_to(folder.parent)))
    return left_out


def main(argv=None) -> int:
    ap = harness.parser(__doc__, os.environ.get("OUT") or "bench_out")
    ap.add_argument("suite", nargs="?", help=f"one of: {', '.join(SUITES)}")
    ap.add_argument("--only", help="comma-separated steps of the suite (default: all)")
    ap.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    ap.add_argument("--list", action="store_true", help="list the suites and their steps")
    args = ap.parse_args(argv)
    if args.list or not args.suite:
        print("\n".join(f"{suite:8s} {name:14s} {sec:4d} s  {' '.join(tool)}" for suite, steps in SUITES.items()
                        for name, (sec, tool) in steps.items()))
        return 0 if args.list else 2
    folder = Path(args.out) / args.suite
    steps = {name: (sec, [sys.executable, str(harness.ROOT / "benchmarks" / tool[0]), *tool[1:], "--out",
                          str(folder / name)]) for name, (sec, tool) in choose(args.suite, args.only).items()}
    if args.dry_run:
        print("\n".join(f"{name} ({sec} s): {' '.join(cmd)}" for name, (sec, cmd) in steps.items()))
        return 0
    harness.prepare_assets()
    if args.suite not in ("matrix", "scale"):       # matrix.py builds its own shapes
        harness.ensure_model()
    start, failed = time.time(), []
    for name, (seconds, cmd) in steps.items():
        (folder / name).mkdir(parents=True, exist_ok=True)
        with open(folder / f"{name}.log", "w") as log:
            try:
                rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=harness.ROOT, env=harness.env(),
                                    timeout=seconds).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
        print(f"{args.suite}/{name}: exit {rc} at {time.time() - start:.0f} s; tail of {name}.log:", flush=True)
        print("".join((folder / f"{name}.log").read_text(errors="replace").splitlines(True)[-25:]), flush=True)
        failed += [name] if rc != 0 else []
    if left_out := pack(folder, Path(args.out) / f"{args.suite}.tgz"):
        print(f"left out of {args.suite}.tgz (over {PACK_FILE_LIMIT >> 20} MiB): {', '.join(left_out)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
