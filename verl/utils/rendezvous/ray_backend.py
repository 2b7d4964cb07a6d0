"""Upstream's `verl.utils.rendezvous.ray_backend`: the Ray rendezvous backend; not supported by this verl (any name raises NotImplementedError)."""
from verl._unsupported import stand_in

__verl_unsupported__ = "the Ray rendezvous backend"
__getattr__ = stand_in(__name__, __verl_unsupported__)
