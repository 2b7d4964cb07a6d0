"""Upstream's `verl.workers.rollout.llm_server`: upstream's async LLM server clients and managers (this verl's rollout runs inside the rollout worker, without an HTTP server); not supported by this verl (any name raises NotImplementedError)."""
from verl._unsupported import stand_in

__verl_unsupported__ = "upstream's async LLM server clients and managers (this verl's rollout runs inside the rollout worker, without an HTTP server)"
__getattr__ = stand_in(__name__, __verl_unsupported__)
