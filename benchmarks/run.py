"""The one runner: a named suite of benchmark steps, each a tool of this folder with its arguments.

    python benchmarks/run.py SUITE [--only STEP,...] [--out DIR] [--dry-run]
    python benchmarks/run.py --list

Each step runs in its own process under its time limit, writing into OUT/SUITE/STEP (OUT: --out, else $OUT,
else ./bench_out); its output is kept in STEP.log. A suite larger than one device call (10 min) is run in
parts with --only. At the end OUT/SUITE.tgz packs the suite's folder (files over 8 MiB left out and listed),
since the device tool returns only a few files. The model is built first when missing (harness.py).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402

ALL_PROFILES = "p40,p100,v100-16gb,t4,rtx3090,a100-40gb,h200"
# suite -> step -> (seconds, tool and its arguments); `{out}` is the step's folder
SUITES = {
    "speed": {       # end-to-end s/step, MFU, peak memory; TRL beside ours; the built-in engine's decode speed
        "rows": (540, ["speed.py", "--rows", "quickstart,p40,grpo", "--steps", "3", "--timeout", "200"]),
        "trl": (300, ["speed.py", "--rows", "trl", "--steps", "3", "--timeout", "280"]),
        "rollout": (330, ["rollout_speed.py", "--cases", "p40,h200,h200_short"]),
    },
    "startup": {     # launch to first step, per start-up stage; run 1 fills the caches
        "cold": (400, ["cold_start.py", "--shapes", "field", "--repeat", "4", "--timeout", "95"]),
    },
    "phases": {      # per phase of one step: time and kernels under the profiler; memory against the model
        "profile": (300, ["profile_step.py", "--profiles", "h200", "--settings", "quickstart,grpo"]),
        "memory": (290, ["memory_model.py", "--profiles", ALL_PROFILES, "--settings", "matrix", "--algos", "ppo,grpo",
                         "--val-rows", "256", "--jobs", "5", "--case-timeout", "200"]),
    },
    "matrix": {      # the stock command under every simulated device profile, PPO and GRPO
        "pre-ampere": (570, ["gpu_matrix.py", "--profiles", "p40,p100,v100-16gb,t4", "--steps", "3", "--test-freq", "2",
                             "--jobs", "8", "--budget-gb", "112", "--cell-timeout", "420"]),
        "ampere-hopper": (570, ["gpu_matrix.py", "--profiles", "rtx3090,a100-40gb,h200", "--steps", "3",
                                "--test-freq", "2", "--jobs", "6", "--budget-gb", "112", "--cell-timeout", "420"]),
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


def command(tool_args: list[str], out: Path) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve().parent / tool_args[0]), *tool_args[1:], "--out", str(out)]


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
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("suite", nargs="?", help=f"one of: {', '.join(SUITES)}")
    ap.add_argument("--only", help="comma-separated steps of the suite (default: all)")
    ap.add_argument("--out", default=os.environ.get("OUT") or "bench_out")
    ap.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    ap.add_argument("--list", action="store_true", help="list the suites and their steps")
    args = ap.parse_args(argv)
    if args.list or not args.suite:
        for suite, steps in SUITES.items():
            for name, (seconds, tool) in steps.items():
                print(f"{suite:8s} {name:14s} {seconds:4d} s  {' '.join(tool)}")
        return 0 if args.list else 2
    steps = choose(args.suite, args.only)
    folder = Path(args.out) / args.suite
    if args.dry_run:
        for name, (seconds, tool) in steps.items():
            print(f"{name} ({seconds} s): {' '.join(command(tool, folder / name))}")
        return 0
    harness.ensure_model()
    start, failed = time.time(), []
    for name, (seconds, tool) in steps.items():
        (folder / name).mkdir(parents=True, exist_ok=True)
        with open(folder / f"{name}.log", "w") as log:
            try:
                rc = subprocess.run(command(tool, folder / name), stdout=log, stderr=subprocess.STDOUT, cwd=harness.ROOT,
                                    env=harness.env(), timeout=seconds).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
        print(f"{args.suite}/{name}: exit {rc} at {time.time() - start:.0f} s; tail of {name}.log:", flush=True)
        print("".join((folder / f"{name}.log").read_text(errors="replace").splitlines(True)[-25:]), flush=True)
        failed += [name] if rc != 0 else []
    left_out = pack(folder, Path(args.out) / f"{args.suite}.tgz")
    if left_out:
        print(f"left out of {args.suite}.tgz (over {PACK_FILE_LIMIT >> 20} MiB): {', '.join(left_out)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
