"""A sampler wrapper that lets a resumed run continue an epoch with the batch after the last one trained.

Upstream keeps this state in torchdata's StatefulDataLoader; here it is two numbers and a generator
state: which epoch, how many batches of it were consumed, and the wrapped sampler's RNG state at the
start of that epoch (a shuffled epoch's order is drawn from it). Restoring that state and skipping the
consumed indices reproduces the rest of the epoch, and every later epoch, exactly.
"""
from __future__ import annotations

import itertools

import torch
from torch.utils.data import Sampler


class ResumableSampler(Sampler):
    def __init__(self, sampler: Sampler, batch_size: int):
        self.sampler = sampler
        self.batch_size = batch_size
        self.epoch_rng_state: torch.Tensor | None = None
        self._resume_rng_state: torch.Tensor | None = None
        self._skip_batches = 0

    @property
    def _generator(self) -> torch.Generator | None:
        return getattr(self.sampler, "generator", None)

    def __len__(self) -> int:
        return len(self.sampler)

    def __iter__(self):
        generator = self._generator
        if generator is not None:
            if self._resume_rng_state is not None:
                generator.set_state(self._resume_rng_state)
            self.epoch_rng_state = generator.get_state()
        skip = self._skip_batches * self.batch_size
        self._resume_rng_state, self._skip_batches = None, 0
        yield from itertools.islice(iter(self.sampler), skip, None)

    def state_dict(self, epoch: int, batches_done: int) -> dict:
        """What `data.pt` holds after `batches_done` batches of `epoch` were trained."""
        return {"epoch": epoch, "batches_done": batches_done, "sampler_rng_state": self.epoch_rng_state,
                "sampler_seed": self._generator.initial_seed() if self._generator is not None else None}

    def load_state_dict(self, state: dict) -> None:
        """Make the next iteration continue `state`'s epoch after its consumed batches."""
        self._resume_rng_state = state.get("sampler_rng_state")
        self._skip_batches = int(state["batches_done"])
