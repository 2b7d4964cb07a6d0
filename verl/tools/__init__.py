"""Tools for multi-turn rollouts: OpenAI-format schemas (`schemas`), the `BaseTool` interface, function tools
and the registry that builds tools from a config file. This verl's rollout engines are single-turn; the classes
are here so tool code written for upstream imports and can be unit-tested."""
