"""What every rollout engine offers the actor/rollout worker."""

from __future__ import annotations

from abc import ABC, abstractmethod

from verl.protocol import DataProto

__all__ = ["BaseRollout"]


class BaseRollout(ABC):
    """A rollout engine turns left-padded prompts into prompt+response batches.

    Input `prompts.batch`: input_ids, attention_mask, position_ids, each (batch, prompt_length).
    Output batch: prompts, responses, response_mask, input_ids, attention_mask, position_ids, with
    responses right-padded to the configured response_length. One response per input row: the
    trainer repeats prompts `rollout.n` times before calling.
    """

    @abstractmethod
    def generate_sequences(self, prompts: DataProto) -> DataProto:
        """Generate one response per row of `prompts`."""
