"""Typed config classes whose fields are a section of this verl's packaged `ppo_trainer.yaml`.

Upstream's `verl.workers.config` spells its dataclasses out field by field. Here the packaged YAML is the one
source of keys and defaults, so a class never drifts from the config the trainer actually reads: each class is a
`BaseConfig` dataclass built from one section (`actor_rollout_ref.actor`, `critic`, ...), its subsections typed
with the classes named for them. `omega_conf_to_dataclass(cfg.critic, FSDPCriticConfig)` therefore accepts exactly
the keys `main_ppo` accepts, and refuses any other key by name.
"""
from __future__ import annotations

import copy
import dataclasses
from functools import lru_cache
from pathlib import Path
from typing import Any, Optional

from verl.base_config import BaseConfig

_CONFIG_DIR = Path(__file__).resolve().parents[1] / "trainer" / "config"
_YAML = _CONFIG_DIR / "ppo_trainer.yaml"


@lru_cache(maxsize=1)
def _packaged() -> dict:
    """ppo_trainer.yaml over the files its `defaults` list names (as Hydra composes them), interpolations resolved."""
    from omegaconf import OmegaConf

    main = OmegaConf.load(_YAML)
    layers = []
    for entry in main.pop("defaults", []):
        if not isinstance(entry, str):  # upstream's config groups: written from this same tree (config/groups.py)
            continue
        layers.append(main if entry == "_self_" else OmegaConf.load(_CONFIG_DIR / f"{entry}.yaml"))
    return OmegaConf.to_container(OmegaConf.merge(*layers) if layers else main, resolve=True)


def section_defaults(path: str) -> dict:
    """The packaged YAML's mapping at dotted `path` (a copy)."""
    node: Any = _packaged()
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            raise KeyError(f"{_YAML.name} has no section {path!r}")
        node = node[part]
    return copy.deepcopy(node)


def _field(value: Any, cls: Optional[type]):
    if cls is not None:
        return (cls, dataclasses.field(default_factory=cls))
    if isinstance(value, dict):
        return (dict[str, Any], dataclasses.field(default_factory=lambda v=value: copy.deepcopy(v)))
    if isinstance(value, list):
        return (list[Any], dataclasses.field(default_factory=lambda v=value: list(v)))
    return (Any, dataclasses.field(default=value))


def section_class(name: str, path: str | None, bases: tuple[type, ...] = (BaseConfig,), *,
                  nested: dict[str, type] | None = None, extra: dict[str, Any] | None = None,
                  mutable: tuple[str, ...] = (), doc: str = "", module: str = __name__) -> type:
    """A dataclass named `name` with one field per key of the YAML section `path` (plus `extra` keys with their
    defaults, for keys upstream has that the section lacks); `nested` types a subsection with a config class."""
    nested = nested or {}
    defaults = section_defaults(path) if path else {}
    defaults.update(extra or {})
    defaults.pop("_target_", None)
    inherited = {f.name for base in bases if dataclasses.is_dataclass(base) for f in dataclasses.fields(base)}
    spec = []
    for key, value in defaults.items():
        if key in inherited and key not in nested:
            continue
        ftype, fdef = _field(value, nested.get(key))
        spec.append((key, ftype, fdef))
    namespace = {"__doc__": doc or f"The `{path}` section, typed.", "__module__": module}
    if mutable:
        namespace["_mutable_fields"] = set(mutable)
    return dataclasses.make_dataclass(name, spec, bases=bases, namespace=namespace)


def unsupported_class(name: str, base: type, feature: str, module: str) -> type:
    """A config class for a backend this verl does not build on: importable, and constructing it says so."""

    def __post_init__(self):
        raise NotImplementedError(f"{name}: {feature} is not supported by this verl (it trains with FSDP2 and "
                                  "rolls out with its HF engine or vLLM); see docs/upstream/compatibility.md")

    return dataclasses.make_dataclass(name, [], bases=(base,), namespace={
        "__post_init__": __post_init__, "__module__": module,
        "__doc__": f"Upstream's {name}: {feature}, not supported here (constructing one raises)."})
