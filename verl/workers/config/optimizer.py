"""Optimizer sections (`actor_rollout_ref.actor.optim`, `critic.optim`) typed, and `build_optimizer`."""
from __future__ import annotations

import importlib

from verl.utils.config_sections import section_class, unsupported_class

__all__ = ["OptimizerConfig", "FSDPOptimizerConfig", "McoreOptimizerConfig", "build_optimizer",
           "VeOmniOptimizerConfig", "TorchtitanOptimizerConfig", "AutomodelOptimizerConfig"]

OptimizerConfig = section_class("OptimizerConfig", "actor_rollout_ref.actor.optim", module=__name__,
                                doc="An optimizer section: learning rate, its schedule, clipping, the class to build.")
FSDPOptimizerConfig = section_class("FSDPOptimizerConfig", None, (OptimizerConfig,), module=__name__,
                                    doc="The optimizer section the FSDP actor and critic read.")
McoreOptimizerConfig = unsupported_class("McoreOptimizerConfig", OptimizerConfig, "the Megatron optimizer", __name__)
VeOmniOptimizerConfig = unsupported_class("VeOmniOptimizerConfig", OptimizerConfig, "the VeOmni engine", __name__)
TorchtitanOptimizerConfig = unsupported_class("TorchtitanOptimizerConfig", OptimizerConfig, "the TorchTitan engine",
                                              __name__)
AutomodelOptimizerConfig = unsupported_class("AutomodelOptimizerConfig", OptimizerConfig, "the NeMo Automodel engine",
                                             __name__)


def build_optimizer(parameters, config):
    """The optimizer class `config.optimizer` from module `config.optimizer_impl` over `parameters`, with the
    section's lr and weight decay, its betas for Adam-family classes, and `override_optimizer_config` on top."""
    kwargs = {"lr": config.lr, "weight_decay": config.weight_decay}
    name = config.optimizer
    if "adam" in name.lower() or "ademamix" in name.lower():
        kwargs["betas"] = tuple(config.betas)
    kwargs.update(dict(config.get("override_optimizer_config") or {}))
    try:
        module = importlib.import_module(config.optimizer_impl)
    except ImportError as exc:
        raise ImportError(f"optim.optimizer_impl={config.optimizer_impl!r} cannot be imported ({exc}); install it or "
                          "set optim.optimizer_impl=torch.optim") from exc
    if not hasattr(module, name):
        raise AttributeError(f"optim.optimizer={name!r} is not defined in {config.optimizer_impl}")
    return getattr(module, name)(parameters, **kwargs)
