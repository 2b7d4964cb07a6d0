"""A run's start-up: the clock that measures it (`clock`) and the tricks that shorten it.

The tricks change how Python and transformers import, never what a run computes:
- `bytecode_cache`: a bytecode folder of verl's own where the environment switched Python's off;
- `transformers_import` (with `import_structure_cache` and `deferred_imports`): transformers' core
  imported without the optional work some releases do at import time.

`VERL_STARTUP_TRICKS=0` turns every trick off at once, for a run that suspects one of them (or a
release they do not know): Python and transformers then import exactly as they would without verl.
The clock keeps measuring either way.
"""
from __future__ import annotations

import os

SWITCH = "VERL_STARTUP_TRICKS"


def tricks_enabled() -> bool:
    """False when the environment sets VERL_STARTUP_TRICKS to 0 / off / false / no."""
    return os.environ.get(SWITCH, "1").strip().lower() not in ("0", "off", "false", "no")
