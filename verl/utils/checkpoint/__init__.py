"""Checkpoints with upstream verl's on-disk layout (see docs/checkpoints.md).

`checkpoint_manager` knows the folder layout (tracker file, `global_step_<N>` folders, retention,
atomic writes); `fsdp_checkpoint_manager` saves and loads one worker's sharded model, optimizer and
extra state.
"""
