"""Upstream's `verl.utils.tokenizer.chat_template`: upstream's chat-template helpers for the async agent loop (this verl renders tool turns in verl.experimental.agent_loop.tool_agent_loop); not supported by this verl (any name raises NotImplementedError)."""
from verl._unsupported import stand_in

__verl_unsupported__ = "upstream's chat-template helpers for the async agent loop (this verl renders tool turns in verl.experimental.agent_loop.tool_agent_loop)"
__getattr__ = stand_in(__name__, __verl_unsupported__)
