"""`python -m verl.model_merger {merge,test} --backend fsdp --local_dir DIR ...` (upstream's command line)."""
from __future__ import annotations

import sys

from verl.model_merger.base_model_merger import generate_config_from_args, parse_args


def main(argv: list[str] | None = None) -> int:
    config = generate_config_from_args(parse_args(argv))
    if config.backend != "fsdp":
        print(f"verl.model_merger: --backend {config.backend} is not supported by this verl, which trains "
              f"with FSDP only; use --backend fsdp.", file=sys.stderr)
        return 2
    from verl.model_merger.fsdp_model_merger import FSDPModelMerger

    FSDPModelMerger(config).merge_and_save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
