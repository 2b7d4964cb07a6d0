"""Import transformers without the optional work some releases do while importing.

Costs paid by every verl process that imports transformers (the driver for its tokenizer, every worker
for its model) on some releases (transformers 5.17 under Python 3.12, for one):

- transformers' import utilities map import names to distributions with
  `importlib.metadata.packages_distributions()`. Python 3.12 infers a distribution's top-level names
  from its file list after checking that every listed file exists: tens of thousands of `stat` calls
  for torch alone. Inside `transformers_import()` the same lists are read without those
  checks; a listed file that was since deleted can only add a name nobody imports.
- scikit-learn (assisted decoding) and scipy (object-detection losses), imported for features verl never
  runs (`verl.utils.startup.deferred_imports`).

And one cost every release pays: the index of the `models` package, built by reading every model's
source, is kept on disk (`verl.utils.startup.import_structure_cache`).

Releases that skip this work at import (transformers 5.24 builds the map lazily) lose nothing. What each
piece saves: docs/performance.md, "Cold start".
"""
from __future__ import annotations

import collections
import csv
import importlib.metadata
import inspect
import sys
from contextlib import contextmanager
from pathlib import PurePosixPath

from verl.utils.startup import tricks_enabled
from verl.utils.startup.deferred_imports import optional_imports_deferred
from verl.utils.startup.import_structure_cache import import_structure_cached


def _top_level_name(listed: str) -> str:
    """The importable name a listed file would provide: its top folder, or its module name."""
    path = PurePosixPath(listed)
    if len(path.parts) > 1:
        return path.parts[0]
    return inspect.getmodulename(listed) or listed


def _listed_top_levels(dist) -> set[str]:
    record = dist.read_text("RECORD")
    if record is None:   # egg-info and other layouts: the standard (checked) list
        listed = [str(path) for path in dist.files or ()]
    else:
        listed = [row[0] for row in csv.reader(record.splitlines()) if row]
    return {name for name in map(_top_level_name, listed) if "." not in name}


def packages_distributions() -> dict[str, list[str]]:
    """Python 3.12's `importlib.metadata.packages_distributions()`, reading each distribution's
    `top_level.txt`, else its RECORD, without checking that the listed files exist."""
    mapping = collections.defaultdict(list)
    for dist in importlib.metadata.distributions():
        names = (dist.read_text("top_level.txt") or "").split() or _listed_top_levels(dist)
        for name in names:
            mapping[name].append(dist.metadata["Name"])
    return dict(mapping)


@contextmanager
def _unchecked_distribution_map():
    # Python < 3.12 checks nothing (and infers from .py files only); a built map is built already.
    if sys.version_info < (3, 12) or "transformers.utils.import_utils" in sys.modules:
        yield
        return
    checked = importlib.metadata.packages_distributions
    importlib.metadata.packages_distributions = packages_distributions
    try:
        yield
    finally:
        importlib.metadata.packages_distributions = checked


@contextmanager
def transformers_import():
    """Run the block, which imports transformers' core, without the optional import-time work above.
    Import an architecture's own modules (and load anything) after the block: see deferred_imports.
    With the start-up tricks switched off (`VERL_STARTUP_TRICKS=0`) the block runs as it is."""
    if not tricks_enabled():
        yield
        return
    with _unchecked_distribution_map(), import_structure_cached(), optional_imports_deferred():
        yield
