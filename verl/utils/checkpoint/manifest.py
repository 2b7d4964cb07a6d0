"""A list of every file in a `global_step_<N>` folder with its size and CRC-32, written last.

The manifest is what tells a complete checkpoint from a damaged one: a shard cut short by a full disk,
a `data.pt` truncated by a copy, a file missing. It covers whatever the folder holds (actor, critic,
`data.pt`, adapters or anything added later), so no component needs to register its files. Loading
checks sizes first (cheap) and then checksums; the first mismatch is reported by path.

A folder whose whole top-level entry is gone (`actor/` pruned by retention, or deleted after a load)
is not damaged: its manifest lines are skipped. A file missing inside an entry that is still there is.
"""
from __future__ import annotations

import json
import os
import zlib
from concurrent.futures import ThreadPoolExecutor

MANIFEST_FILE = "checkpoint_manifest.json"
FORMAT = 1
_CHUNK = 8 << 20


class DamagedCheckpointError(ValueError):
    """A checkpoint file does not match the manifest (or cannot be read); `path` names the file."""

    def __init__(self, path: str, reason: str):
        self.path, self.reason = path, reason
        super().__init__(
            f"damaged checkpoint file {path}: {reason}. Delete its global_step_<N> folder (resume_mode=auto then "
            "uses the previous complete one), point trainer.resume_from_path at another global_step_<N>, or start "
            "fresh with trainer.resume_mode=disable."
        )


def crc32_of(path: str) -> int:
    """CRC-32 of a file, read in chunks (zlib releases the GIL, so files are summed in parallel)."""
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return crc


def _files(folder: str) -> list[str]:
    """Every file under `folder`, relative and '/'-separated, the manifest itself and `.partial` leftovers excluded."""
    out = []
    for here, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if not d.endswith(".partial"))
        for name in names:
            rel = os.path.relpath(os.path.join(here, name), folder).replace(os.sep, "/")
            if rel != MANIFEST_FILE and not name.endswith(".partial"):
                out.append(rel)
    return sorted(out)


def _sums(folder: str, names: list[str]) -> list[int]:
    with ThreadPoolExecutor(max_workers=min(8, max(1, len(names)))) as pool:
        return list(pool.map(lambda rel: crc32_of(os.path.join(folder, rel)), names))


def write_manifest(folder: str) -> str:
    """Record every file of `folder` (size, CRC-32) in its manifest, atomically; returns the manifest's path."""
    names = _files(folder)
    entries = {rel: {"size": os.path.getsize(os.path.join(folder, rel)), "crc32": f"{crc:08x}"}
               for rel, crc in zip(names, _sums(folder, names))}
    path = os.path.join(folder, MANIFEST_FILE)
    tmp = path + ".partial"
    with open(tmp, "w") as f:
        json.dump({"format": FORMAT, "files": entries}, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return path


def verify(folder: str, checksums: bool = True) -> None:
    """Raise `DamagedCheckpointError` naming the first file of `folder` that differs from its manifest
    (presence and size; with `checksums`, also the CRC-32, which reads every file).

    A folder without a manifest (written before manifests existed) passes: there is nothing to check."""
    path = os.path.join(folder, MANIFEST_FILE)
    if not os.path.isfile(path):
        return
    try:
        with open(path) as f:
            entries = json.load(f)["files"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise DamagedCheckpointError(path, f"the manifest cannot be read ({err})") from None
    checked = []
    for rel, entry in sorted(entries.items()):
        top = rel.split("/", 1)[0]
        full = os.path.join(folder, *rel.split("/"))
        if "/" in rel and not os.path.isdir(os.path.join(folder, top)):
            continue  # the whole entry was pruned or deleted after a load, not damaged
        if not os.path.isfile(full):
            raise DamagedCheckpointError(full, "it is listed in the manifest but missing")
        size = os.path.getsize(full)
        if size != entry["size"]:
            raise DamagedCheckpointError(full, f"it has {size} bytes, the manifest says {entry['size']}")
        checked.append(rel)
    if not checksums:
        return
    for rel, crc in zip(checked, _sums(folder, checked)):
        if f"{crc:08x}" != entries[rel]["crc32"]:
            raise DamagedCheckpointError(os.path.join(folder, *rel.split("/")),
                                         f"its CRC-32 is {crc:08x}, the manifest says {entries[rel]['crc32']}")
