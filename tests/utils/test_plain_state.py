"""Checkpoint files are plain tensors and values, read with weights_only=True; RNG states survive that."""
import os
import random

import numpy as np
import pytest
import torch

from verl.utils.checkpoint.plain_state import UnsafeCheckpointError, host_rng_state, load_plain, set_host_rng_state


class _RunsCode:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def _draws():
    return random.random(), float(np.random.rand()), float(np.random.randn()), float(torch.rand(1))


def test_rng_states_round_trip_through_a_weights_only_file(tmp_path):
    np.random.randn()  # leaves a cached gaussian in numpy's state: it must survive too
    torch.save({"rng": host_rng_state()}, tmp_path / "state.pt")
    expected = _draws()
    _draws()
    set_host_rng_state(load_plain(tmp_path / "state.pt")["rng"])
    assert _draws() == expected


def test_a_file_carrying_code_is_refused_with_its_name(tmp_path):
    marker = tmp_path / "ran"
    path = tmp_path / "extra_state_world_size_1_rank_0.pt"
    torch.save({"rng": _RunsCode(marker)}, path)
    with pytest.raises(UnsafeCheckpointError, match=f"refusing to load {path}"):
        load_plain(path)
    assert not marker.exists()

