"""Upstream's `verl.experimental`: of its modules this verl implements the agent loop (multi-turn, tool-calling
rollouts)."""
