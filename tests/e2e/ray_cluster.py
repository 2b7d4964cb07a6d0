"""A real multi-node Ray cluster on one machine, for tests: a head and worker nodes, each its own raylet.

Ray's `ray.cluster_utils.Cluster` starts the nodes. It runs in a separate keeper process, started by
`LocalRayCluster`, for two reasons: the test process's own Ray (the session's `ray_session`) is left
alone, and the keeper points RAY_TMPDIR at a private folder, because the cluster utility records the
cluster as "the current one" in `<tmp>/ray/ray_current_cluster`, where any plain `ray.init()` on the
machine (another test, the single-node run we compare against) would otherwise attach to it.

The keeper prints one JSON line with the address and node ids, then obeys `kill <node_id>` (the node's
raylet and workers die at once, no graceful stop), `wait_dead <node_id>` and `quit` on stdin. If the test process dies, the
keeper's stdin closes and it shuts the cluster down; Ray's reaper kills what is left.
"""
from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

START_TIMEOUT_S = 120
COMMAND_TIMEOUT_S = 60


class LocalRayCluster:
    """Context manager: `with LocalRayCluster([1, 1]) as c: c.address, c.head_id, c.node_ids, c.kill(id)`.

    `cpus_per_node[0]` is the head's CPU count; each node advertises only its own CPUs, so Ray must
    spread CPU workers over the nodes.
    """

    def __init__(self, cpus_per_node: list[int], env: dict | None = None):
        self.cpus_per_node = cpus_per_node
        self.env = env or {}
        self.tmpdir = tempfile.mkdtemp(prefix="vrc")  # short: Ray's socket paths must stay < 108 chars
        self.proc = None
        self._lines: queue.Queue = queue.Queue()

    def __enter__(self) -> "LocalRayCluster":
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        env.update(self.env, RAY_TMPDIR=self.tmpdir)
        self.proc = subprocess.Popen([sys.executable, __file__, ",".join(map(str, self.cpus_per_node))],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        threading.Thread(target=self._read, daemon=True).start()
        try:
            info = json.loads(self._expect("{", START_TIMEOUT_S))
        except BaseException:
            self.__exit__(None, None, None)
            raise
        self.address, self.head_id, self.node_ids = info["address"], info["head"], info["nodes"]
        return self

    def _read(self) -> None:
        for line in self.proc.stdout:
            self._lines.put(line.strip())
        self._lines.put(None)

    def _expect(self, prefix: str, timeout: float) -> str:
        while True:
            try:
                line = self._lines.get(timeout=timeout)
            except queue.Empty:
                raise TimeoutError(f"the Ray cluster keeper did not answer within {timeout} s") from None
            if line is None:
                raise RuntimeError(f"the Ray cluster keeper exited (status {self.proc.poll()})")
            if line.startswith(prefix):
                return line

    def kill(self, node_id: str) -> None:
        """Kill a worker node's raylet and its workers without warning (a machine that drops off)."""
        self.proc.stdin.write(f"kill {node_id}\n")
        self.proc.stdin.flush()
        self._expect(f"killed {node_id}", COMMAND_TIMEOUT_S)

    def wait_dead(self, node_id: str) -> None:
        """Return once the cluster's control store lists the killed node as dead (its health checks ran)."""
        self.proc.stdin.write(f"wait_dead {node_id}\n")
        self.proc.stdin.flush()
        self._expect(f"dead {node_id}", COMMAND_TIMEOUT_S)

    def __exit__(self, *exc) -> None:
        try:
            if self.proc.poll() is None:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.flush()
            self.proc.wait(timeout=COMMAND_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait(timeout=COMMAND_TIMEOUT_S)
        shutil.rmtree(self.tmpdir, ignore_errors=True)


def _keep(cpus_per_node: list[int]) -> None:
    from ray.cluster_utils import Cluster

    node_args = {"include_dashboard": False, "object_store_memory": 150 * 1024**2}
    # health checks every 1 s, 3 misses: a killed node is listed dead after ~4 s instead of ~17 s (test time)
    health = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3}
    cluster = Cluster(initialize_head=True,
                      head_node_args={"num_cpus": cpus_per_node[0], "_system_config": health, **node_args})
    try:
        nodes = {cluster.head_node.node_id: cluster.head_node}
        for cpus in cpus_per_node[1:]:
            node = cluster.add_node(num_cpus=cpus, **node_args)
            nodes[node.node_id] = node
        cluster.wait_for_nodes(timeout=START_TIMEOUT_S)
        print(json.dumps({"address": cluster.address, "head": cluster.head_node.node_id, "nodes": list(nodes)}),
              flush=True)
        for line in sys.stdin:
            command, _, arg = line.strip().partition(" ")
            if command == "kill":
                cluster.remove_node(nodes.pop(arg), allow_graceful=False)
                print(f"killed {arg}", flush=True)
            elif command == "wait_dead":
                deadline = time.monotonic() + COMMAND_TIMEOUT_S
                while any(n["NodeID"] == arg and n["Alive"] for n in cluster.global_state.node_table()):
                    if time.monotonic() > deadline:
                        break  # the test side times out waiting for the answer
                    time.sleep(0.2)
                else:
                    print(f"dead {arg}", flush=True)
            elif command == "quit":
                break
    finally:
        cluster.shutdown()


if __name__ == "__main__":
    os.makedirs(Path(os.environ["RAY_TMPDIR"]), exist_ok=True)
    _keep([int(n) for n in sys.argv[1].split(",")])
