"""The checkpoint folder layout, shared by the trainer and the workers:

    <root>/latest_checkpointed_iteration.txt      N, written last, so it only ever names a complete step
    <root>/global_step_<N>/actor/ ... critic/ ... data.pt checkpoint_manifest.json

Every piece is written under a temporary name and renamed into place once complete, so a crash in
the middle of a save leaves the previous checkpoint (and the tracker pointing at it) untouched. The
manifest (sizes and checksums of every file of the step, see `manifest`) is written after the pieces
and before the tracker; a resume checks it and passes over a damaged step to the newest sound one.
"""
from __future__ import annotations

import os
import re
import shutil
from contextlib import contextmanager

import torch

from verl.utils.checkpoint.disk_space import CheckpointSpaceError, free_bytes, needs_explaining, require_space
from verl.utils.checkpoint.manifest import DamagedCheckpointError, verify, write_manifest

TRACKER_FILE = "latest_checkpointed_iteration.txt"
STEP_PREFIX = "global_step_"
_STEP_DIR = re.compile(rf"^{STEP_PREFIX}(\d+)$")
PARTIAL_SUFFIX = ".partial"


def get_checkpoint_tracker_filename(root_path: str) -> str:
    return os.path.join(root_path, TRACKER_FILE)


def step_folder(root_path: str, step: int) -> str:
    return os.path.join(root_path, f"{STEP_PREFIX}{step}")


def step_of(folder: str) -> int:
    """The N of a `.../global_step_<N>` path; a clear error for any other path."""
    match = _STEP_DIR.match(os.path.basename(os.path.normpath(folder)))
    if match is None:
        raise ValueError(f"{folder!r} is not a checkpoint folder: its last component must be {STEP_PREFIX}<N>")
    return int(match.group(1))


def find_latest_ckpt_path(root_path: str | None, components=("actor",), checksums: bool = True) -> str | None:
    """The folder the tracker names if it is there and sound; else the newest complete, sound one (with a
    warning naming what was passed over); None when there is no tracker or nothing usable. A complete
    folder holds every one of `components` and `data.pt`; a sound one matches its manifest (file sizes,
    and with `checksums` the CRC-32s too). An empty or garbled tracker raises `CheckpointTrackerError`."""
    step = None if root_path is None else tracked_step(root_path)
    if step is None:
        return None
    folder = step_folder(root_path, step)
    tracker = get_checkpoint_tracker_filename(root_path)
    if os.path.isdir(folder):
        problem = damage(folder, checksums)
        if problem is None:
            return folder
        why = f"{folder} is damaged ({problem})"
    else:
        why = f"{folder} does not exist"
    for other in reversed(complete_steps(root_path, components)):
        if other == step:
            continue
        fallback = step_folder(root_path, other)
        problem = damage(fallback, checksums)
        if problem is None:
            print(f"WARNING: {tracker} names step {step}, but {why}; resuming from the newest complete "
                  f"checkpoint instead, {fallback}", flush=True)
            return fallback
        print(f"WARNING: passing over {fallback}: it is damaged ({problem})", flush=True)
    print(f"WARNING: {tracker} names step {step}, but {why} and no other complete checkpoint is there: "
          "training from scratch", flush=True)
    return None


def damage(folder: str, checksums: bool = True) -> str | None:
    """What is wrong with the files of a step folder (naming the file), or None when it matches its manifest."""
    try:
        verify(folder, checksums)
    except DamagedCheckpointError as err:
        return f"{err.path}: {err.reason}"
    return None


@contextmanager
def saving_step(root_path: str, step: int):
    """Around the writes of one step's pieces into the yielded folder: afterwards the manifest, then the
    tracker. Before it, the disk must have room for a step the size of the last saved one. If anything
    fails (a full disk, a worker error, Ctrl-C), a step folder this save created is removed again, so no
    half-written step stays on the disk; a full disk becomes `CheckpointSpaceError`."""
    folder = step_folder(root_path, step)
    created = not os.path.exists(folder)
    previous = tracked_step(root_path)
    expected = 0  # a step the size of the last one saved
    if previous is not None and previous != step:
        expected = bytes_under(step_folder(root_path, previous))
        require_space(folder, expected)
    try:
        yield folder
        write_manifest(folder)
        write_tracker(root_path, step)
    except BaseException as err:
        needed = max(expected, bytes_under(folder))
        if created:
            shutil.rmtree(folder, ignore_errors=True)
        if needs_explaining(err):
            raise CheckpointSpaceError(folder, needed, free_bytes(root_path), during=True) from err
        raise


def bytes_under(folder: str) -> int:
    """Bytes of all files under `folder` (0 when it does not exist)."""
    return sum(os.path.getsize(os.path.join(here, name)) for here, _, names in os.walk(folder) for name in names)


def save_data_state(folder: str, state: dict) -> str:
    """Write the driver's `data.pt` into a step folder atomically; returns its path."""
    path = os.path.join(folder, "data.pt")
    os.makedirs(folder, exist_ok=True)
    tmp = path + PARTIAL_SUFFIX
    try:
        torch.save(state, tmp)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    os.replace(tmp, path)
    return path


def complete_steps(root_path: str, components=("actor",)) -> list[int]:
    """Steps whose folder holds every one of `components` and `data.pt`, oldest first."""
    steps = set(saved_steps(root_path, components[0])) if components else set()
    for component in components[1:]:
        steps &= set(saved_steps(root_path, component))
    return sorted(s for s in steps if os.path.isfile(os.path.join(step_folder(root_path, s), "data.pt")))


def write_tracker(root_path: str, step: int) -> None:
    """Point the tracker at `step` (atomically: readers see the old or the new number, never half a file)."""
    tracker = get_checkpoint_tracker_filename(root_path)
    tmp = tracker + PARTIAL_SUFFIX
    with open(tmp, "w") as f:
        f.write(str(step))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, tracker)


def partial_path(path: str) -> str:
    """Where the pieces of `path` are written before `publish` renames them into place."""
    return os.path.normpath(path) + PARTIAL_SUFFIX


def publish(path: str) -> None:
    """Move the finished `partial_path(path)` to `path`, replacing an older copy of the same step."""
    path = os.path.normpath(path)
    if os.path.exists(path):
        shutil.rmtree(path)
    os.replace(partial_path(path), path)


def saved_steps(root_path: str, component: str) -> list[int]:
    """Steps under `root_path` whose `component` (actor, critic) is complete, oldest first."""
    if not os.path.isdir(root_path):
        return []
    steps = []
    for name in os.listdir(root_path):
        match = _STEP_DIR.match(name)
        if match and os.path.isdir(os.path.join(root_path, name, component)):
            steps.append(int(match.group(1)))
    return sorted(steps)


class CheckpointTrackerError(ValueError):
    """The tracker file exists but does not hold a step number."""


def tracked_step(root_path: str) -> int | None:
    """The step the tracker names; None without a tracker file."""
    tracker = get_checkpoint_tracker_filename(root_path)
    if not os.path.exists(tracker):
        return None
    with open(tracker, errors="replace") as f:
        text = f.read().strip()
    if not text.isdigit():
        raise CheckpointTrackerError(
            f"{tracker} should hold the step number of the newest complete checkpoint, but it holds "
            f"{text[:40]!r}{' (empty)' if not text else ''}. Write the N of a complete global_step_<N> folder "
            "into it (one with actor/ and data.pt), or resume from one with trainer.resume_mode=resume_path "
            "trainer.resume_from_path=<dir>/global_step_<N>, or start fresh with trainer.resume_mode=disable."
        )
    return int(text)


def prune(root_path: str, component: str, keep: int | None) -> list[int]:
    """Delete `component` from all but the newest `keep` steps (None or <= 0 keeps all); returns the steps
    pruned. The step the tracker names is never pruned: until the tracker moves on, it is the only
    checkpoint known to be complete. A step folder left with neither actor nor critic goes entirely."""
    if not keep or keep <= 0:
        return []
    protected = tracked_step(root_path)
    steps = saved_steps(root_path, component)
    pruned = [s for s in steps[:-keep] if s != protected]
    for step in pruned:
        folder = step_folder(root_path, step)
        shutil.rmtree(os.path.join(folder, component), ignore_errors=True)
        if not any(os.path.isdir(os.path.join(folder, c)) for c in ("actor", "critic")):
            shutil.rmtree(folder, ignore_errors=True)
    return pruned


def _is_adapter_key(name: str) -> bool:
    return "lora_" in name or ".adapter_" in name


class BaseCheckpointManager:
    """Upstream's base of the per-worker checkpoint managers: what a save and a load hold, from the role's
    `checkpoint` config (`save_contents` / `load_contents`, `save_lora_only`). Subclasses write the files."""

    DEFAULT_CONTENTS = ("model", "optimizer", "extra")

    def __init__(self, model, optimizer, lr_scheduler=None, processing_class=None, checkpoint_config=None):
        self.model, self.optimizer, self.lr_scheduler = model, optimizer, lr_scheduler
        self.processing_class = processing_class
        self.checkpoint_config = checkpoint_config
        config = checkpoint_config or {}
        self.checkpoint_save_contents = list(config.get("save_contents", None) or self.DEFAULT_CONTENTS)
        self.checkpoint_load_contents = list(config.get("load_contents", None) or self.DEFAULT_CONTENTS)
        self.previous_global_step = None
        self.previous_saved_paths: list[str] = []
        import torch.distributed as dist

        initialized = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if initialized else 0
        self.world_size = dist.get_world_size() if initialized else 1

    should_save_model = property(lambda self: "model" in self.checkpoint_save_contents)
    should_save_optimizer = property(lambda self: "optimizer" in self.checkpoint_save_contents)
    should_save_extra = property(lambda self: "extra" in self.checkpoint_save_contents)
    should_save_hf_model = property(lambda self: "hf_model" in self.checkpoint_save_contents)
    should_load_model = property(lambda self: "model" in self.checkpoint_load_contents)
    should_load_optimizer = property(lambda self: "optimizer" in self.checkpoint_load_contents)
    should_load_extra = property(lambda self: "extra" in self.checkpoint_load_contents)
    should_load_hf_model = property(lambda self: "hf_model" in self.checkpoint_load_contents)

    @property
    def should_save_lora_only(self) -> bool:
        """`checkpoint.save_lora_only`: a LoRA model's model shards hold its adapter weights alone."""
        config = self.checkpoint_config
        if not config:
            return False
        value = config.get("save_lora_only", False) if hasattr(config, "get") else getattr(config, "save_lora_only", False)
        return bool(value)

    @staticmethod
    def is_lora_only_state_dict(state_dict) -> bool:
        """True for a non-empty state dict whose every key names an adapter weight (`lora_` or `.adapter_`)."""
        return bool(state_dict) and all(_is_adapter_key(k) for k in state_dict)

    def save_checkpoint(self, local_path: str, hdfs_path: str | None = None, global_step: int = 0,
                        max_ckpt_to_keep: int | None = None):
        raise NotImplementedError(f"{type(self).__name__} does not save checkpoints")

    def load_checkpoint(self, local_path: str, hdfs_path: str | None = None, del_local_after_load: bool = False):
        raise NotImplementedError(f"{type(self).__name__} does not load checkpoints")

