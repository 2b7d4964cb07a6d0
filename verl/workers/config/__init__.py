"""Typed config sections for every role (upstream's `verl.workers.config`).

Each class's keys and defaults are this verl's packaged `ppo_trainer.yaml` section (see
`verl.utils.config_sections`); build one from a composed config with
`verl.utils.config.omega_conf_to_dataclass(cfg.critic, FSDPCriticConfig)`. Classes for backends this verl does
not build on (Megatron, VeOmni, TorchTitan, ...) import, and raise NotImplementedError when constructed.
"""
from . import actor, checkpoint, critic, disaggregation, distillation, engine, model, optimizer, reward, rollout
from .actor import *  # noqa: F401,F403
from .checkpoint import *  # noqa: F401,F403
from .critic import *  # noqa: F401,F403
from .disaggregation import *  # noqa: F401,F403
from .distillation import *  # noqa: F401,F403
from .engine import *  # noqa: F401,F403
from .model import *  # noqa: F401,F403
from .optimizer import *  # noqa: F401,F403
from .reward import *  # noqa: F401,F403
from .rollout import *  # noqa: F401,F403

__all__ = (actor.__all__ + critic.__all__ + reward.__all__ + engine.__all__ + optimizer.__all__ + rollout.__all__
           + model.__all__ + distillation.__all__ + disaggregation.__all__ + checkpoint.__all__)
