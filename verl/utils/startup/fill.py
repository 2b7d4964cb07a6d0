"""What `bytecode_cache.fill_beside` runs on a fresh machine, in a low-priority process of its own, beside the run:

- compile the heavy packages' bytecode into the run's empty cache folder on the host's spare cores (the driver's and
  the workers' imports then find most of it written instead of compiling one module at a time on one core);
- read through the shared libraries the first GPU step loads (torch's CUDA library, the CUDA math libraries, Triton's
  compiler). On a fresh machine their first read comes from a cold disk, often a lazily fetched image, in the middle
  of the first step; read beside the start-up, they are in the page cache when the step needs them.

    python -X pycache_prefix=FOLDER -m verl.utils.startup.fill --workers N --skip REGEX DIR [DIR ...]
"""
from __future__ import annotations

import argparse
import compileall
import importlib.util
import os
import re
from concurrent.futures import ThreadPoolExecutor

# packages whose shared libraries and tools a GPU run loads in its first step
LIBRARY_PACKAGES = ("torch", "triton", "nvidia")
READ_THREADS = 4
CHUNK = 8 << 20


def library_files(packages=LIBRARY_PACKAGES) -> list[str]:
    """Shared libraries (`*.so`, `*.so.N`) and `bin/` tools under the installed `packages`, largest first."""
    files = []
    for name in packages:
        spec = importlib.util.find_spec(name)
        for root in getattr(spec, "submodule_search_locations", None) or []:
            for folder, _, names in os.walk(root):
                tools = os.path.basename(folder) == "bin"
                files += [os.path.join(folder, n) for n in names if tools or re.search(r"\.so(\.|$)", n)]
    return sorted(files, key=lambda f: -os.path.getsize(f) if os.path.exists(f) else 0)


def read_through(path: str) -> int:
    """Read `path` once (into the page cache); the bytes read, 0 where it cannot be read."""
    buffer, total = bytearray(CHUNK), 0
    try:
        with open(path, "rb", buffering=0) as f:
            while count := f.readinto(buffer):
                total += count
    except OSError:
        return 0
    return total


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--skip", default=None, help="regular expression of source paths not to compile")
    ap.add_argument("dirs", nargs="*")
    args = ap.parse_args(argv)
    skip = re.compile(args.skip) if args.skip else None
    with ThreadPoolExecutor(READ_THREADS) as pool:   # file reads release the GIL: they run beside the compile
        reads = pool.map(read_through, library_files())
        ok = all([compileall.compile_dir(d, quiet=2, rx=skip, workers=args.workers) for d in args.dirs])
        sum(reads)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
