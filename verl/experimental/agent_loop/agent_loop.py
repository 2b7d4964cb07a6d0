"""The agent-loop interface and registry. An agent loop owns one sample: the driver hands it each model turn
(`on_generated`) and reads back the context to continue from; the loop appends the model's tokens
(response_mask 1) and any observation tokens it adds, such as tool responses (response_mask 0)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["AgentLoopBase", "AgentLoopOutput", "ToolListWrap", "get_agent_loop_class", "register"]

_registry: dict[str, type["AgentLoopBase"]] = {}


class ToolListWrap:
    """Holds a list of tool objects so `hydra.utils.instantiate` passes it through as is (it would turn each
    tool in a plain list argument into a DictConfig). Agent loops accept one in place of their tools dict."""

    def __init__(self, tools: list):
        self.tools = tools


def register(agent_name: str):
    """Class decorator: data rows name the loop by `agent_name`."""
    def wrap(cls):
        _registry[agent_name] = cls
        return cls
    return wrap


def get_agent_loop_class(agent_name: str) -> type["AgentLoopBase"]:
    if agent_name not in _registry:
        raise ValueError(f"agent_name {agent_name!r} (the data row's agent_name, or actor_rollout_ref.rollout.agent."
                         f"default_agent_loop) is not a registered agent loop; known: {sorted(_registry)}")
    return _registry[agent_name]


@dataclass
class AgentLoopOutput:
    """One finished sample: its prompt, its response (model and observation tokens) and which are the model's."""

    prompt_ids: list[int]
    response_ids: list[int]
    response_mask: list[int]
    num_turns: int = 0
    metrics: dict[str, Any] = field(default_factory=dict)


class AgentLoopBase:
    """One sample's rollout. `response_length` bounds model plus observation tokens together."""

    def __init__(self, rollout_config, tokenizer, tools: dict, response_length: int):
        self.config = rollout_config
        self.tokenizer = tokenizer
        if isinstance(tools, ToolListWrap):
            tools = {tool.name: tool for tool in tools.tools}
        self.tools = tools
        self.response_length = int(response_length)
        self.prompt_ids: list[int] = []
        self.response_ids: list[int] = []
        self.response_mask: list[int] = []
        self.done = False
        self._turn: list[int] = []   # the model turn in progress, generated over more than one round
        self.assistant_turns = 0
        self.user_turns = 0
        self.kwargs: dict[str, Any] = {}

    def start(self, prompt_ids: list[int], **kwargs) -> None:
        """Begin the sample from its prompt tokens; `kwargs` are the row's (tools_kwargs, raw_prompt, ...)."""
        self.prompt_ids = list(prompt_ids)
        self.kwargs = kwargs

    @property
    def context_ids(self) -> list[int]:
        """What the model continues from next."""
        return self.prompt_ids + self.response_ids + self._turn

    @property
    def remaining(self) -> int:
        return self.response_length - len(self.response_ids) - len(self._turn)

    def extend_turn(self, token_ids: list[int]) -> None:
        """Keep tokens of a model turn that is not finished yet (the driver's round ended first)."""
        self._turn.extend(token_ids)

    def take_turn(self, token_ids: list[int]) -> list[int]:
        """The whole finished turn: earlier rounds' tokens plus these; clears the turn in progress."""
        turn, self._turn = self._turn + list(token_ids), []
        return turn

    def _append(self, ids: list[int], model_made: bool) -> None:
        ids = list(ids)[: max(self.remaining, 0)]
        self.response_ids.extend(ids)
        self.response_mask.extend([1 if model_made else 0] * len(ids))

    async def on_generated(self, token_ids: list[int], ended: bool) -> None:
        """Take one whole model turn (`ended`: it stopped at EOS rather than at the length budget)."""
        raise NotImplementedError

    def output(self) -> AgentLoopOutput:
        return AgentLoopOutput(prompt_ids=self.prompt_ids, response_ids=self.response_ids,
                               response_mask=self.response_mask,
                               num_turns=self.assistant_turns + self.user_turns + 1)
