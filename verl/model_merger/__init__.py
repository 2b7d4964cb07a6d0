"""Turn a training checkpoint into a Hugging Face model folder (upstream's `verl.model_merger`).

    python -m verl.model_merger merge --backend fsdp --local_dir <ckpt>/global_step_<N>/actor --target_dir <dir>

See `base_model_merger` for the command line and `fsdp_model_merger` for how shards are joined.
"""
