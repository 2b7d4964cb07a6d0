"""Multi-turn rollouts over any rollout engine: each row's agent loop (`agent_name`, default
`rollout.agent.default_agent_loop`) decides what follows a model turn; the engine generates the next turn for
every unfinished row at once, from its whole context so far. Output has the engine's layout (responses
right-padded to rollout.response_length) with `response_mask` 0 on tool/observation tokens, so the actor's
losses, KL and entropy skip them while the model still attends to them (attention_mask 1)."""
from __future__ import annotations

import asyncio
import itertools

import numpy as np
import torch

from verl.experimental.agent_loop import get_agent_loop_class
from verl.protocol import DataProto

__all__ = ["MultiTurnRollout", "load_tools"]


def load_tools(multi_turn_config) -> dict:
    """name -> tool, from multi_turn.tool_config_path and function_tool_path."""
    from verl.tools.tool_registry import load_all_tools

    tools = load_all_tools(multi_turn_config.get("tool_config_path"), multi_turn_config.get("function_tool_path"))
    return {tool.name: tool for tool in tools}


def _left_padded(contexts: list[list[int]], pad_id: int) -> dict[str, torch.Tensor]:
    width = max(len(c) for c in contexts)
    ids = torch.full((len(contexts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(contexts), width), dtype=torch.long)
    for i, c in enumerate(contexts):
        ids[i, width - len(c):] = torch.tensor(c, dtype=torch.long)
        mask[i, width - len(c):] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return {"input_ids": ids, "attention_mask": mask, "position_ids": pos}


def _object_array(rows: list[list[int]]) -> np.ndarray:
    out = np.empty(len(rows), dtype=object)
    for i, row in enumerate(rows):   # one list per element (a slice assignment may broadcast equal lengths)
        out[i] = row
    return out


def round_length(contexts: list[list[int]], remaining: list[int], width_cap: int) -> int:
    """Tokens to generate this round: the most any row may still add, but no more than keeps the padded
    batch (longest context + generated) within prompt_length + response_length, the width the plan's memory
    model sized. At least 1: the longest context is a prompt plus fewer than response_length tokens."""
    return max(1, min(max(remaining), width_cap - max(len(c) for c in contexts)))


class MultiTurnRollout:
    """Drives agent loops with `engine` (any `BaseRollout`). `config` is actor_rollout_ref.rollout."""

    def __init__(self, engine, tokenizer, config, tools: dict | None = None):
        self.engine = engine
        self.tokenizer = tokenizer
        self.config = config
        self.tools = load_tools(config.multi_turn) if tools is None else tools
        self.default_agent = (config.get("agent") or {}).get("default_agent_loop", "single_turn_agent")

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        meta = dict(prompts.meta_info)
        response_length = int(meta.get("response_length", self.config.response_length))
        eos_ids = meta["eos_token_id"]
        eos_ids = set(eos_ids if isinstance(eos_ids, (list, tuple)) else [eos_ids])
        pad_id = int(meta.get("pad_token_id") if meta.get("pad_token_id") is not None else min(eos_ids))
        ids, mask = prompts.batch["input_ids"], prompts.batch["attention_mask"]
        nt = prompts.non_tensor_batch
        agents = []
        for i in range(len(prompts)):
            name = nt["agent_name"][i] if "agent_name" in nt and nt["agent_name"][i] else self.default_agent
            agent = get_agent_loop_class(str(name))(self.config, self.tokenizer, self.tools, response_length)
            agent.start(ids[i][mask[i].bool()].tolist(),
                        tools_kwargs=nt["tools_kwargs"][i] if "tools_kwargs" in nt else {})
            agents.append(agent)
        engine_metrics: dict = {}
        width_cap = ids.shape[1] + response_length
        for round_index in itertools.count():
            active = [a for a in agents if not a.done]
            if not active:
                break
            contexts = [a.context_ids for a in active]
            length = round_length(contexts, [a.remaining for a in active], width_cap)
            turn = DataProto.from_dict(tensors=_left_padded(contexts, pad_id),
                                       non_tensors={"raw_prompt_ids": _object_array(contexts)},
                                       meta_info={**meta, "response_length": length,
                                                  # the policy does not change between rounds: push it once
                                                  "weights_unchanged": round_index > 0})
            out = self.engine.generate_sequences(turn)
            engine_metrics.update(out.meta_info.get("metrics") or {})
            finished = []
            for agent, row, row_mask in zip(active, out.batch["responses"], out.batch["response_mask"]):
                tokens = row[row_mask.bool()].tolist()[: agent.remaining]
                ended = any(t in eos_ids for t in tokens)
                if not ended and len(tokens) < agent.remaining:
                    agent.extend_turn(tokens)   # cut by this round's length only: the turn goes on next round
                else:
                    finished.append((agent, agent.take_turn(tokens), ended))
            asyncio.run(self._advance(finished))
        output = self._assemble(prompts, agents, response_length, pad_id)
        output.meta_info["metrics"] = {**engine_metrics, **output.meta_info["metrics"]}
        return output

    @staticmethod
    async def _advance(turns) -> None:
        await asyncio.gather(*(agent.on_generated(tokens, ended) for agent, tokens, ended in turns))

    @staticmethod
    def _assemble(prompts: DataProto, agents, response_length: int, pad_id: int) -> DataProto:
        ids, mask, pos = (prompts.batch[k] for k in ("input_ids", "attention_mask", "position_ids"))
        batch = len(agents)
        # built on the host and moved once to where the prompts are (the engine's device on a GPU worker)
        responses = torch.full((batch, response_length), pad_id, dtype=ids.dtype)
        response_mask = torch.zeros((batch, response_length), dtype=mask.dtype)
        response_attention = torch.zeros((batch, response_length), dtype=mask.dtype)
        for i, agent in enumerate(agents):
            out = agent.output()
            n = len(out.response_ids)
            responses[i, :n] = torch.tensor(out.response_ids, dtype=ids.dtype)
            response_mask[i, :n] = torch.tensor(out.response_mask, dtype=mask.dtype)
            response_attention[i, :n] = 1
        responses, response_mask, response_attention = (t.to(ids.device) for t in
                                                        (responses, response_mask, response_attention))
        offsets = torch.arange(1, response_length + 1, dtype=pos.dtype, device=pos.device)
        tensors = {
            "prompts": ids,
            "responses": responses,
            "response_mask": response_mask,
            "input_ids": torch.cat([ids, responses], dim=-1),
            "attention_mask": torch.cat([mask, response_attention], dim=-1),
            "position_ids": torch.cat([pos, pos[:, -1:] + offsets], dim=-1),
        }
        outputs = [a.output() for a in agents]
        non_tensors = dict(prompts.non_tensor_batch)
        non_tensors["__num_turns__"] = np.array([o.num_turns for o in outputs], dtype=np.int64)
        non_tensors["tool_calls"] = np.array([o.metrics.get("tool_calls", 0) for o in outputs], dtype=np.int64)
        meta = dict(prompts.meta_info)
        # per sequence: tool calls run, and tokens the model attends to but is not trained on
        meta["metrics"] = {
            "multi_turn/tool_calls": float(non_tensors["tool_calls"].mean()),
            "multi_turn/observation_tokens": float(((response_attention == 1) & (response_mask == 0)).sum(-1)
                                                   .float().mean()),
        }
        return DataProto.from_dict(tensors=tensors, non_tensors=non_tensors, meta_info=meta)
