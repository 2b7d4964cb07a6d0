"""`BaseConfig`: upstream's base for typed config sections (a dataclass that reads like a dict).

Custom estimators and losses annotate their `config` argument with subclasses of it
(`verl.trainer.config.AlgoConfig`, ...). Fields are read-only after construction unless listed in
`_mutable_fields`, so a config cannot be changed behind the trainer's back.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import FrozenInstanceError, dataclass, fields
from typing import Any, ClassVar

__all__ = ["BaseConfig"]


@dataclass
class BaseConfig(Mapping):
    """A dataclass with `cfg.get(key, default)`, `cfg[key]`, iteration over field names and `len`."""

    _mutable_fields: ClassVar[set[str]] = set()
    _target_: str = ""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self.__dict__ and name not in self._mutable_fields:
            raise FrozenInstanceError(f"{type(self).__name__}.{name} is read-only (not in _mutable_fields)")
        super().__setattr__(name, value)

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key, default)

    def __getitem__(self, key: str) -> Any:
        return getattr(self, key)

    def __iter__(self):
        return (f.name for f in fields(self))

    def __len__(self) -> int:
        return len(fields(self))
