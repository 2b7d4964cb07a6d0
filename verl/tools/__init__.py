"""Tools for multi-turn rollouts: OpenAI-format schemas (`schemas`), the `BaseTool` interface, function tools,
the registry that builds tools from a config file, and upstream's GSM8K tool (`gsm8k_tool`). The `tool_agent`
loop (`verl.experimental.agent_loop`) calls them; see docs/multi_turn.md."""
