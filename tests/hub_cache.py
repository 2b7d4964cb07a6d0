"""Put a local model folder into a Hugging Face cache under a hub id, as a download would leave it.

Tests resolve `Qwen/Qwen2.5-0.5B-Instruct` with HF_HUB_OFFLINE=1 from such a cache: the real
huggingface_hub lookup runs, and nothing is downloaded.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

FAKE_COMMIT = "0123456789abcdef0123456789abcdef01234567"


def add_to_hub_cache(model_dir: str | Path, hf_home: str | Path, repo_id: str) -> Path:
    """Copy `model_dir` into `<hf_home>/hub` as the `main` snapshot of `repo_id`; return the snapshot."""
    repo = Path(hf_home) / "hub" / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / FAKE_COMMIT
    shutil.copytree(model_dir, snapshot, dirs_exist_ok=True)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(FAKE_COMMIT)
    return snapshot


def offline_env(hf_home: str | Path) -> dict[str, str]:
    """The environment of a user whose cache is `hf_home` and who is offline."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_") and k != "RAY_ADDRESS"}
    env.update(HF_HOME=str(hf_home), HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    return env
