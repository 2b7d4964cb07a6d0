"""Checkpoint files hold tensors and plain values only, and are read back with `weights_only=True`.

A full unpickler runs whatever a file tells it to, so a checkpoint copied from elsewhere (or edited)
could execute code on resume. Everything this build writes is therefore tensors, numbers, strings,
None, lists, tuples and dicts; random-generator states are turned into tensors here. A file that needs
more than that is refused with `UnsafeCheckpointError`, naming the file, before anything in it runs.
"""
from __future__ import annotations

import pickle
import random

import numpy as np
import torch


class UnsafeCheckpointError(ValueError):
    """A checkpoint file holds Python objects beyond tensors and plain values; it was not loaded."""


def load_plain(path: str):
    """`torch.load(path, weights_only=True)`, with a refusal that names the file and what to do; a file cut
    short or garbled (torch's "PytorchStreamReader failed ...") becomes `DamagedCheckpointError` naming it."""
    from verl.utils.checkpoint.manifest import DamagedCheckpointError

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (EOFError, RuntimeError) as err:
        if isinstance(err, RuntimeError) and "PytorchStreamReader" not in str(err):
            raise
        raise DamagedCheckpointError(path, f"it cannot be read ({str(err).strip().splitlines()[0]})") from None
    except pickle.UnpicklingError as err:
        reason = str(err).strip().splitlines()
        detail = next((line.strip() for line in reason if "GLOBAL" in line or "Unsupported" in line),
                      reason[0] if reason else "")
        raise UnsafeCheckpointError(
            f"refusing to load {path}: it holds Python objects, not only tensors and plain values "
            f"({detail}). Unpickling it could run arbitrary code, so it was not read. Checkpoints written "
            "by this verl never need that: if this file came from elsewhere or was edited, delete this "
            "checkpoint folder (resume_mode=auto then picks the previous one) or start fresh with "
            "trainer.resume_mode=disable."
        ) from None


def host_rng_state() -> dict:
    """Python's, numpy's and torch's CPU generators, as tensors and numbers."""
    version, internal, gauss_next = random.getstate()
    kind, keys, pos, has_gauss, cached_gaussian = np.random.get_state()
    return {
        "cpu": torch.get_rng_state(),
        "numpy": {"kind": str(kind), "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached_gaussian": float(cached_gaussian)},
        "random": {"version": int(version), "internal": torch.tensor(internal, dtype=torch.int64),
                   "gauss_next": gauss_next},
    }


def set_host_rng_state(state: dict) -> None:
    torch.set_rng_state(state["cpu"])
    numpy = state["numpy"]
    np.random.set_state((numpy["kind"], numpy["keys"].numpy().astype(np.uint32), numpy["pos"], numpy["has_gauss"],
                         numpy["cached_gaussian"]))
    py = state["random"]
    random.setstate((py["version"], tuple(int(v) for v in py["internal"].tolist()), py["gauss_next"]))


def rng_state(device_type: str) -> dict:
    """Host generators under "cpu"/"numpy"/"random", the accelerator's (if any) under its device type."""
    state = host_rng_state()
    if device_type != "cpu":
        state[device_type] = torch.get_device_module(device_type).get_rng_state()
    return state


def set_rng_state(state: dict, device_type: str) -> None:
    set_host_rng_state(state)
    if device_type != "cpu" and device_type in state:
        torch.get_device_module(device_type).set_rng_state(state[device_type])
