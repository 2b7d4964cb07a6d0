"""transformers imported without its optional import-time work: the distribution map is Python 3.12's
without the file checks, and the standard function is back in place after the import."""
from __future__ import annotations

import importlib.metadata
import inspect
import sys
from pathlib import PurePosixPath

import pytest

from verl.utils.startup import transformers_import
from verl.utils.startup.transformers_import import packages_distributions


def _reference() -> dict[str, list[str]]:
    """Python 3.12's packages_distributions, written out: declared names, else every listed file that
    exists, reduced to its top folder or module name, names with a dot dropped."""
    mapping: dict[str, list[str]] = {}
    for dist in importlib.metadata.distributions():
        names = (dist.read_text("top_level.txt") or "").split()
        if not names:
            tops = set()
            for path in dist.files or ():
                if not path.locate().exists():
                    continue
                parts = PurePosixPath(str(path)).parts
                tops.add(parts[0] if len(parts) > 1 else inspect.getmodulename(str(path)) or str(path))
            names = [n for n in tops if "." not in n]
        for name in names:
            mapping.setdefault(name, []).append(dist.metadata["Name"])
    return mapping


def test_the_map_equals_python_312s_on_an_intact_install():
    ours = packages_distributions()
    reference = _reference()
    assert ours.keys() == reference.keys()
    assert {k: sorted(v) for k, v in ours.items()} == {k: sorted(v) for k, v in reference.items()}
    assert "torch" in ours and "transformers" in ours


def test_distributions_with_a_record_are_read_without_their_checked_file_list(monkeypatch):
    def checked_list(self):
        if self.read_text("RECORD") is not None:
            raise AssertionError(f"{self.metadata['Name']}: the checked file list was read")
        return None

    monkeypatch.setattr(importlib.metadata.Distribution, "files", property(checked_list))
    assert "torch" in packages_distributions()


def test_the_standard_function_is_swapped_only_inside_the_block(monkeypatch):
    monkeypatch.setattr(sys, "version_info", (3, 12, 0))
    standard = importlib.metadata.packages_distributions
    monkeypatch.delitem(sys.modules, "transformers.utils.import_utils", raising=False)   # as before the import
    with transformers_import._unchecked_distribution_map():
        inside = importlib.metadata.packages_distributions
    assert inside is packages_distributions and importlib.metadata.packages_distributions is standard
    monkeypatch.setitem(sys.modules, "transformers.utils.import_utils", object())      # imported: nothing to swap
    with transformers_import._unchecked_distribution_map():
        assert importlib.metadata.packages_distributions is standard


@pytest.mark.parametrize("listed, name", [("foo.py", "foo"), ("foo/__init__.py", "foo"), ("foo.pth", "foo.pth"),
                                          ("foo.cpython-311-x86_64-linux-gnu.so", "foo"), ("../../bin/x", "..")])
def test_top_level_names(listed, name):
    assert transformers_import._top_level_name(listed) == name
