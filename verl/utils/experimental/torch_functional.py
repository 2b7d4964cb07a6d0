"""Upstream's `verl.utils.experimental.torch_functional`: the fused linear + log-prob kernel for PPO; not supported by this verl (any name raises NotImplementedError)."""
from verl._unsupported import stand_in

__verl_unsupported__ = 'the fused linear + log-prob kernel for PPO'
__getattr__ = stand_in(__name__, __verl_unsupported__)
