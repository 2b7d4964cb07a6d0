"""`omega_conf_to_dataclass`: a composed Hydra section as a typed config (upstream's helper)."""
from __future__ import annotations

from dataclasses import is_dataclass
from typing import Any

__all__ = ["omega_conf_to_dataclass"]


def omega_conf_to_dataclass(config, dataclass_type: type | None = None) -> Any:
    """`config` (a DictConfig or dict) as an instance of `dataclass_type`, the dataclass's defaults filled
    in and unknown keys refused by OmegaConf. Without a type, the section's `_target_` names the class
    (a dataclass is built as above, its subsections typed; any other target is instantiated through Hydra).
    An empty config gives the defaults; a non-mapping is returned as is."""
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if not config:
        return dataclass_type() if dataclass_type is not None else None
    if not isinstance(config, (DictConfig, ListConfig, dict, list)):
        return config
    if dataclass_type is None:
        if "_target_" not in config:
            raise ValueError("omega_conf_to_dataclass needs dataclass_type, or a config with _target_ naming the "
                             f"class to build; got keys {sorted(config)}")
        from hydra.utils import get_class, instantiate

        target = get_class(config["_target_"])
        if not is_dataclass(target):
            return instantiate(config, _convert_="partial")
        dataclass_type = target
    if not is_dataclass(dataclass_type):
        raise ValueError(f"{dataclass_type} is not a dataclass")
    if isinstance(config, (DictConfig, ListConfig)):  # resolved in place: its interpolations may point outside it
        config = OmegaConf.to_container(config, resolve=True)
    merged = OmegaConf.merge(OmegaConf.structured(dataclass_type), OmegaConf.create(config))
    return OmegaConf.to_object(merged)
