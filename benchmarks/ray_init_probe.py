"""How long Ray itself takes to start on this machine, under the settings that could shorten it.

Each variant runs in a fresh process (`--child`) that times `import ray`, `ray.init(...)`, one empty
actor started with per-actor env vars (as the worker group starts its workers: a new worker process
each), its first call, and `ray.shutdown()`. Prints a table (median over --repeat) and writes
ray_init_probe.json to --out.

    python benchmarks/ray_init_probe.py --repeat 2 --out /tmp/ray_probe
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

VARIANTS = {
    "default": ({}, {}),
    "no_dashboard": ({"include_dashboard": False}, {}),
    "no_prestart": ({}, {"RAY_enable_worker_prestart": "0", "RAY_prestart_worker_first_driver": "0"}),
    "lean": ({"include_dashboard": False},
             {"RAY_enable_worker_prestart": "0", "RAY_prestart_worker_first_driver": "0"}),
}


def child(init_kwargs: dict) -> dict:
    laps, last = {}, time.perf_counter()

    def lap(name):
        nonlocal last
        now = time.perf_counter()
        laps[name] = round(now - last, 3)
        last = now

    import ray
    lap("import_ray")
    ray.init(**init_kwargs)
    lap("ray_init")

    @ray.remote(num_cpus=1)
    class Empty:
        def ping(self):
            return os.getpid()

    actor = Empty.options(runtime_env={"env_vars": {"RANK": "0"}}).remote()
    ray.get(actor.ping.remote(), timeout=120)
    lap("first_actor")
    second = Empty.options(runtime_env={"env_vars": {"RANK": "1"}}).remote()
    ray.get(second.ping.remote(), timeout=120)
    lap("second_actor")
    ray.shutdown()
    lap("shutdown")
    return laps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--out", default="ray_init_probe_out")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print("LAPS " + json.dumps(child(VARIANTS[args.child][0])), flush=True)
        return
    names = [v for v in args.variants.split(",") if v]
    runs: dict[str, list[dict]] = {n: [] for n in names}
    for i in range(args.repeat):
        for name in names:   # alternated, so drift on the machine hits every variant alike
            env = {**os.environ, **VARIANTS[name][1]}
            start = time.perf_counter()
            done = subprocess.run([sys.executable, __file__, "--child", name], env=env, capture_output=True,
                                  text=True, timeout=300)
            wall = round(time.perf_counter() - start, 2)
            line = next((ln for ln in done.stdout.splitlines() if ln.startswith("LAPS ")), None)
            laps = json.loads(line[5:]) if line else {"error": done.stderr[-800:]}
            laps["process_wall"] = wall
            runs[name].append(laps)
            print(f"{name} run {i + 1}: {laps}", flush=True)
    keys = ["import_ray", "ray_init", "first_actor", "second_actor", "shutdown", "process_wall"]
    lines = ["| variant | " + " | ".join(keys) + " |", "|---|" + "---|" * len(keys)]
    for name in names:
        cells = []
        for key in keys:
            values = [r[key] for r in runs[name] if key in r]
            cells.append(f"{statistics.median(values):.2f}" if values else "n/a")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    table = "\n".join(lines)
    print(table)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "ray_init_probe.json").write_text(json.dumps({"runs": runs, "table": table}, indent=1))


if __name__ == "__main__":
    main()
